"""Scale-out: Serval's data plane in Ray Serve replicas behind one KServe v2 ingress."""
