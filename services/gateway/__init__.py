"""The HTTP inference gateway: the Open Inference Protocol (KServe v2 REST) in front of an aggregator or a model server."""
