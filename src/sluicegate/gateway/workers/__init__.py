"""``serve --workers N``: the supervisor, its worker processes, their run dirs and private Redis.

The top of the gateway: a worker builds the app (``gateway/app.py``).
"""
