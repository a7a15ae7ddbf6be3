"""The worker service: dequeues batches, pulls parameters, computes gradients, pushes them."""
