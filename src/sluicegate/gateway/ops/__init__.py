"""Operations: health, readiness, admin, metrics exposition, the dashboard, and the loops
that watch the cluster (the pressure loop, the backend probes and scrapes).

May import ``request``, ``batch_lane``, ``distributed`` and the gateway's root.
"""
