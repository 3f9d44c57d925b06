from provider_lab import cli

raise SystemExit(cli.main())
