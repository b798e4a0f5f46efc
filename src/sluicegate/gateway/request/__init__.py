"""One inference request: authenticate, read and classify it, wait for admission, relay it.

May import ``gateway.streams``, ``gateway.upstream`` and the gateway root; not ``ops``,
``workers``, ``batch_lane`` or ``distributed`` (those drive or watch requests).
"""
