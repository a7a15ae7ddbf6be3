"""Models: the model spec and protocol, the built-in MLP and its kernels (one file per backend)."""
