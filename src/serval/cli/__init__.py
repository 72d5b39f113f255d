"""The `serval` command: one module per command; flags become config, nothing else."""
