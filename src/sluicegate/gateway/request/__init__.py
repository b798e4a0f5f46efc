"""One inference request: authenticate, read and classify it, wait for admission, relay it.

``serving.py``'s ``serve_ticket`` is the seam the HTTP handler and the batch runner
share. May import ``gateway.streams``, ``gateway.upstream``, ``gateway.distributed`` and
the gateway's root; never ``ops``, ``batch_lane`` or ``workers``, which sit above it.
"""
