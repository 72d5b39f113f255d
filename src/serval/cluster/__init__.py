"""Scale-out: Serval's serving stack in Ray Serve replicas behind one KServe v2 ingress."""
