"""Jobs: what runs services together (a local training cluster, sweeps, ensembles, `up`, status, the demo)."""
