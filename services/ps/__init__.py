"""The parameter-server service: a shard of the variables, their optimizer slots and update rules
(the rules themselves live in common/optimizers.py, shared with all-reduce workers)."""
