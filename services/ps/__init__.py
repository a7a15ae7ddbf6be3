"""The parameter-server service: a shard of the variables, their optimizer slots and update rules."""
