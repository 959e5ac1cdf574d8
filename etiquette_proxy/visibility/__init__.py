"""What the operator sees (SPEC §11): the board, the dashboard page, Prometheus metrics, the report."""
