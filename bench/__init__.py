"""QuoteFlow's benchmark: ``make bench`` (see ``bench/run.py`` and ``docs/benchmark.md``)."""
