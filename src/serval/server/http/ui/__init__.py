"""The status page: its static assets (static/), its JSON view of the registry (status) and the
routes that serve both."""
