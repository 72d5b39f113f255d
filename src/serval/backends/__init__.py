"""What serves a model version: the Backend protocol, one module per engine, and pipelines
(a composite of other models)."""
