"""`zmqflow sweep`: hyperparameter sweeps, many small trainings in parallel on one cluster."""
