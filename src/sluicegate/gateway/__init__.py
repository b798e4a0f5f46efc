"""The gateway: the OpenAI-compatible HTTP server that drives ``core.Scheduler`` in real time.

Its root holds the application (``app.py``), the asyncio driver of the scheduler
(``asyncio_driver.py``), its clock and timer, the state built from the config, the
edge protocol and the one place errors become HTTP answers (``http_errors.py``). The
sub-packages: ``request`` (one inference request, from body to relay), ``streams``
(event streams: split, account, reassemble), ``upstream`` (the engines: HTTP/1.1
client, probes and scrapes), ``distributed`` (the link to the shared store), ``workers``
(``serve --workers N``), ``batch_lane`` (the Batch API and its runner) and ``ops``
(admin, metrics, dashboard, pressure). The gateway may import ``core``, ``engine``,
``store``, ``batches``, ``outcomes`` and ``config``; nothing below imports it.
"""
