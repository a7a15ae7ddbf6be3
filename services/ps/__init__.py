"""The parameter-server service: a shard of the variables, their optimizer slots and update rules."""

DEFAULT_OPTIMIZER = {"kind": "adam", "learning_rate": 0.004}
"""The one default optimizer: a ps started without --optimizer, `zmqflow train`, sweeps, zmqflow.Job and
zmqflow.Server. Adam 0.004 reaches 0.918-0.926 test accuracy on the 4,500-row MNIST split in 10 epochs in
every mode (async with its staleness, sync with 2 replicas, ps-preloaded; 3 runs each). 0.002 left sync,
which makes half as many steps, at 0.898-0.912, too close to the 0.90 target; SGD 0.5 (the ps's default
before) stays near 0.89: `zmqflow train --epochs 10` (async, 1 ps, 2 workers) scored the same accuracy with
both, 0.894, with a test log loss of 0.336 for Adam 0.004 against 0.359 for SGD 0.5 (0.606 and 0.706 after
2 epochs)."""
