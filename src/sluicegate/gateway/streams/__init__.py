"""OpenAI event streams: split into events, accounted, and reassembled into one answer.

Pure byte and JSON handling: no sockets, no scheduler, no other gateway sub-package.
Imported by ``gateway.request``.
"""
