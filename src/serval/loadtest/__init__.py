"""Load generation against any KServe v2 server: closed-loop sweeps with exact latencies."""
