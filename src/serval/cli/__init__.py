"""The `serval` command: one module per command; flags become config, nothing else."""

INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C (128 + SIGINT)
