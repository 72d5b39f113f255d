"""What Serval tells operators: Prometheus metrics, logs, recent rates (over serval.stats)."""
