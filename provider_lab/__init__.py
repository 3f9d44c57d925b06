"""The provider lab: fake suppliers with switchable faults, on real sockets.

Run it with ``python -m provider_lab`` (or ``make lab``). It shares no code with
``quoteflow``: it writes the supplier wire formats from its own definitions, so a
drift between QuoteFlow's parser and a supplier fails a test instead of hiding.
Each supplier answers the classic way (``/quotes/{supplier}``) and in three foreign
dialects (:mod:`provider_lab.dialects`): POST JSON behind an OAuth2 bearer token
from the lab's token endpoint (:mod:`provider_lab.oauth2`), the SKU in the
path with an API key, and many parts in one call (batch).
:mod:`provider_lab.adapters` reads those dialects as a QuoteFlow user's adapter
would. :mod:`provider_lab.contracts` holds a supplier to a contract, a rate and
a concurrency, in every dialect.
"""
