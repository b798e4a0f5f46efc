"""The engines as the gateway reaches them: the HTTP/1.1 client, error mapping, probes, scrapes.

Everything an engine sends is bounded here (head, headers, body, events). May import
``gateway.http_errors`` and ``core``; nothing of ``gateway.request``.
"""
