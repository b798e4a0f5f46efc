"""Operations: health, readiness, admin, Prometheus metrics, the dashboard, the pressure loop."""
