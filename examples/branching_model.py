"""A model split over workers that is not a chain: an input stage feeding two parallel branches on two
workers, whose outputs a join stage concatenates (or adds); then two copies of a two-stage pipeline
on four workers, each copy reading its own batches.

    python examples/branching_model.py
    zmqflow train --model examples/branching_model.py:build --num-workers 4                  # the DAG
    zmqflow train --model examples/pipeline_model.py:build --num-workers 4 --mode sync       # 2 copies x 2 stages

The split is given as for a chain, by the layers' device strings (`/job:worker/task:N`), on a functional
model (`keras.Model(inputs, outputs)`): a layer without a task runs where the layer it reads does. Worker
0 sends each micro-batch's activations to both branches at once; the join waits for both, computes the
loss and sends each branch its gradient back; worker 0 sums the two gradients of the tensor it sent to
both. Prints the test accuracy of the DAG on 4 workers and of the same model on one worker.
"""

import json
import sys

INPUT, LEFT, RIGHT, JOIN = (f"/job:worker/task:{k}" for k in range(4))


def build(input_signature, width=128, branch=64, join="concatenate", pipelined=True):
    """784 -> `width` (task 0) -> two branches of `branch` units (tasks 1 and 2) -> joined (task 3) -> 10."""
    from zmqflow import keras
    layers = keras.layers
    (name, (shape, dtype)), = input_signature.items()
    on = (lambda device: device) if pipelined else (lambda device: None)
    x = keras.Input(shape, dtype=dtype, name=name)
    trunk = layers.Dense(width, activation="relu", device=on(INPUT))(x)
    left = layers.Dense(branch, activation="relu", device=on(LEFT))(trunk)
    right = layers.Dense(branch, activation="tanh", device=on(RIGHT))(trunk)
    joined = (layers.Concatenate if join == "concatenate" else layers.Add)(device=on(JOIN))([left, right])
    return keras.LayerModel(keras.Model(x, layers.Dense(10)(joined)), seed=0)


def main(epochs=3):
    from pipeline_model import train      # its neighbour in examples/: one compute thread per worker
    dag = train(True, 4, epochs, build=f"{__file__}:build")
    single = train(False, 1, epochs, build=f"{__file__}:build")
    print(json.dumps({"dag": {k: dag[k] for k in ("test_accuracy", "examples_per_s", "global_step")},
                      "one_worker": {k: single[k] for k in ("test_accuracy", "examples_per_s", "global_step")}}))
    print(f"branching_model: test accuracy {dag['test_accuracy']:.3f} with the branches on 4 workers (one worker: "
          f"{single['test_accuracy']:.3f}); {dag['examples_per_s']} examples/s against {single['examples_per_s']}")
    return 0 if dag["test_accuracy"] > 0.85 else 1


if __name__ == "__main__":
    raise SystemExit(main(*(int(a) for a in sys.argv[1:2])))
