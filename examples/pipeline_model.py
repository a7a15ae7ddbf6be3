"""A model split over two workers (the seeds' vertical split): its first layers run on worker 0,
the others on worker 1, as a pipeline of micro-batches; then the same model on one worker.

    python examples/pipeline_model.py
    zmqflow train --model examples/pipeline_model.py:build --num-workers 2    # the same job, by hand

Layers carry TensorFlow device strings: `/job:worker/task:1` puts a layer (and those after it)
on worker 1. Worker 0 dequeues each batch, cuts it into micro-batches and sends each one's
activations to worker 1 as soon as they are computed; worker 1 sends the gradients of the loss
back, and both compute at once. Prints the test accuracy and examples/s of both runs, each
worker with one compute thread.

Pipelines pay when a model's layers are heavy against the cost of a hop between workers, or when
a model does not fit one worker. On a small machine where the ps and every worker share two
cores, the hops cost more than the overlap gains (docs/models.md has the figures).
"""

import json
import sys

from zmqflow.jobs.local_cluster import run_training

WORKER_0, WORKER_1 = "/job:worker/task:0", "/job:worker/task:1"


def build(input_signature, width=512, pipelined=True):
    """784 -> 3 hidden layers of `width` -> 10: one hidden layer on worker 0, two (and the softmax) on
    worker 1 (which also computes the loss), so the two stages do about the same work."""
    from zmqflow.models.layer_model import LayerModel
    from zmqflow.models.layers import Dense
    from zmqflow.models.network import Sequential
    (shape, _), = input_signature.values()
    on = (lambda device: device) if pipelined else (lambda device: None)
    layers = [Dense(width, activation="relu", device=on(WORKER_0)),
              Dense(width, activation="relu", device=on(WORKER_1)),
              Dense(width, activation="relu"),
              Dense(10)]
    return LayerModel(Sequential(layers, input_shape=shape), seed=0)


def train(pipelined, workers, epochs, build=f"{__file__}:build"):
    """One compute thread per worker: the pipeline's two workers get two cores, the one worker one.
    `build`: the model's function (examples/branching_model.py trains its own with this)."""
    model = {"type": build, "pipelined": pipelined}
    return run_training(progress=False, num_workers=workers, epochs=epochs, model=model, input="preloaded",
                        optimizer={"kind": "adam", "learning_rate": 0.001}, threads_per_worker=1)


def main(epochs=6):
    pipeline = train(True, 2, epochs)
    single = train(False, 1, epochs)
    speedup = pipeline["examples_per_s"] / single["examples_per_s"]
    print(json.dumps({"pipeline": {k: pipeline[k] for k in ("test_accuracy", "examples_per_s", "global_step")},
                      "one_worker": {k: single[k] for k in ("test_accuracy", "examples_per_s", "global_step")}}))
    print(f"pipeline_model: test accuracy {pipeline['test_accuracy']:.3f} on 2 workers (one worker: "
          f"{single['test_accuracy']:.3f}); {pipeline['examples_per_s']} examples/s against "
          f"{single['examples_per_s']} on one worker ({speedup:.2f}x)")
    return 0 if pipeline["test_accuracy"] > 0.85 else 1


if __name__ == "__main__":
    raise SystemExit(main(*(int(a) for a in sys.argv[1:2])))
