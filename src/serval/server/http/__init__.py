"""KServe v2 REST over ASGI: routes, body codecs, error mapping."""
