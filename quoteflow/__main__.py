from quoteflow.cli import main

raise SystemExit(main())
