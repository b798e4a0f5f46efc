"""The gateway: the OpenAI-compatible HTTP server that drives ``core.Scheduler`` in real time.

Its root holds the application (``app.py``), the asyncio driver of the scheduler
(``asyncio_driver.py``), its clock and timer, the state built from the config, the
edge protocol and ``http_errors.py`` (``GatewayError`` and its one rendering). The
sub-packages, bottom first (each imports the root's modules and only the sub-packages
below it; ``state.py`` and ``app.py`` wire them all; ``tests/test_house.py`` checks it):

- ``streams`` (event streams: split, account, reassemble), ``upstream`` (the engines:
  the HTTP/1.1 client, its caps and error mapping), ``distributed`` (the link to the
  shared store, worker siblings);
- ``request`` (one inference request, from body to relay; ``serve_ticket``);
- ``batch_lane`` (the Batch API and the runner that calls ``serve_ticket``);
- ``ops`` (health, admin, metrics exposition, dashboard, the pressure and probe loops);
- ``workers`` (``serve --workers N``: above the app it starts).

The gateway may import ``core``, ``engine``, ``store``, ``batches``, ``outcomes`` and
``config``; nothing below it imports the gateway.
"""
