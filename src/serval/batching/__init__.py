"""Dynamic batching: pure batch formation, tensor merge/split, and the per-model queue task."""
