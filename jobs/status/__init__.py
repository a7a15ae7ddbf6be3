"""`zmqflow status`: a live view of a running cluster (probe.py asks, render.py draws, command.py loops)."""
