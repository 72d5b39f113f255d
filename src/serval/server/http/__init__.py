"""KServe v2 REST on Serval's own HTTP/1.1 (reader, protocol, timer, wire): the routes (app),
the error table, the OpenAPI document and the status page (ui/)."""
