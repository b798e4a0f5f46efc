"""The durable batch lane: OpenAI's Files and Batches APIs over the engines' idle capacity.

``batches_config`` is the ``batches:`` config section, ``lines`` reads and checks
the JSONL a batch is made of, ``objects`` shapes what the API answers, and a
``BatchBackend`` (``batch_backend``) keeps every file, batch, line and result
durably: ``sqlite/`` in one SQLite file, ``redis/`` in the shared store of
distributed mode (DESIGN §20). The gateway serves the API
(``gateway/batch_lane/batch_api.py``) and runs the lines (``gateway/batch_lane/line_runner.py``).
"""
