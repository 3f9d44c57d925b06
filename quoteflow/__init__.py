"""QuoteFlow: the cheapest supplier for a SKU and quantity, within one time budget."""

__version__ = "0.1.0"
