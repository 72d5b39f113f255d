"""The model repository: what is on disk, and which model versions are loaded and serving."""
