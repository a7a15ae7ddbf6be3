"""`zmqflow ensemble`: serve a sweep's best models behind an aggregator and compare them."""
