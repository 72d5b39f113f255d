"""The status page: its static assets (static/) and the routes that serve them and its JSON."""
