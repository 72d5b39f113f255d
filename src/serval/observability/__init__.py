"""What Serval tells operators: per-model statistics, Prometheus metrics, logs."""
