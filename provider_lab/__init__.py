"""The provider lab: fake suppliers with switchable faults, on real sockets.

Run it with ``python -m provider_lab`` (or ``make lab``). It shares no code with
``quoteflow``: it writes the supplier wire format from its own definitions, so a
drift between QuoteFlow's parser and a supplier fails a test instead of hiding.
"""
