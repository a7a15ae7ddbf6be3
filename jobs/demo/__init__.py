"""`make demo`: the queue tour (tour.py), then the whole story (story.py)."""
