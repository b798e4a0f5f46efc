"""The engines as the gateway reaches them: the HTTP/1.1 client, error mapping, caps.

Everything an engine sends is bounded here (head, headers, body, events). May import
``core`` and the gateway's ``http_errors`` and ``timer``; no sibling.
"""
