"""The batch lane in a gateway process: the Files and Batches APIs, the line runner, the sweeper.

Durable state lives in ``sluicegate.batches``; this package is its HTTP face and the
loop that runs lines on idle capacity through ``request``'s ``serve_ticket``. May import
``request``, ``distributed`` and the gateway's root.
"""
