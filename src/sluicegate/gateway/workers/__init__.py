"""``serve --workers N``: the supervisor, its worker processes, their fan-out and private Redis."""
