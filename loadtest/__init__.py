"""Load tests against running services (open-loop arrivals)."""
