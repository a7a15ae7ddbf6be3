"""Your own model in a file of your own: `build(input_signature, **options)` returns a model.

zmqflow passes the data's `outputs` (its classes, label columns, or 1 for a regression) and `task`
to a build that declares them, and refuses a model whose output width disagrees with the data.

    zmqflow train --model examples/my_model.py:build --model-opt width=64 --epochs 5 --checkpoint-dir /tmp/mine
    zmqflow serve --checkpoint /tmp/mine --model examples/my_model.py:build   # code runs only where you name it

Run as a script it checks the model on one batch without a cluster.
"""

from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Dense, Dropout, LayerNorm
from zmqflow.models.network import Sequential


LOSSES = {"multiclass": "softmax_cross_entropy", "binary": "softmax_cross_entropy",
          "multi_label": "sigmoid_cross_entropy", "regression": "mse"}


def build(input_signature, outputs=10, task="multiclass", width=128, dropout=0.1):
    (shape, _dtype), = input_signature.values()        # e.g. {"input": ((784,), "float32")}
    network = Sequential([Dense(width, activation="gelu"), LayerNorm(), Dropout(dropout), Dense(outputs)],
                         input_shape=shape)
    return LayerModel(network, loss=LOSSES[task], seed=0)


if __name__ == "__main__":
    import numpy as np

    from zmqflow.inputs.datasets import load_mnist
    model = build({"input": ((784,), "float32")})
    print(model.network.summary())
    x, y = load_mnist()
    params = model.initial_values()
    for _ in range(100):
        loss, grads, metrics = model.step(params, (x[:128], y[:128]))
        for name, g in grads.items():
            params[name] -= 0.1 * g
    print(f"my_model: loss {loss:.3f}, accuracy {metrics['accuracy']:.3f} on the batch it fitted")
