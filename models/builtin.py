"""Built-in models by name, each a small spec over zmqflow's layers.

    {"type": "mlp", "layers": [784, 100, 10], "activation": "sigmoid"}   the seeds' MLP (models/spec.py):
                           Dense layers `hidden` ... `softmax` with TF's variable names, weights and biases;
                           `"loss": "mse"` (or huber) regresses, `layers` ending in the outputs
    {"type": "cnn"}        the TensorFlow tutorial's MNIST CNN: conv 5x5x32, pool, conv 5x5x64, pool,
                           dense 1024 (relu), dense 10; flat 784-pixel rows (or `inputs` of any
                           shape) reshaped to `image`, 28x28x1; `"loss": "mse", "outputs": 1` regresses
    {"type": "logistic", "inputs": 784, "classes": 10}   softmax regression
    {"type": "linear", "inputs": 13, "outputs": 1, "loss": "mse"}   linear regression (or "huber")
"""

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Conv2D, Dense, Dropout, Flatten, MaxPool2D, Reshape
from zmqflow.models.network import Sequential
from zmqflow.models.spec import layer_names

CNN_DEFAULTS = {"inputs": 784, "image": [28, 28, 1], "classes": 10, "outputs": None, "filters": [32, 64],
                "kernel_size": 5, "dense": 1024, "dropout": 0.0, "loss": "softmax_cross_entropy", "seed": 0,
                "dtype": "float32"}
LOGISTIC_DEFAULTS = {"inputs": 784, "classes": 10, "seed": 0, "dtype": "float32"}
LINEAR_DEFAULTS = {"inputs": 1, "outputs": 1, "loss": "mse", "seed": 0, "dtype": "float32"}


def _options(spec, defaults):
    unknown = sorted(set(spec) - set(defaults) - {"type"})
    if unknown:
        raise InvalidArgumentError(f"model spec field {unknown[0]!r} is not known for type {spec['type']!r}; "
                                   f"known: {', '.join(sorted(defaults))}")
    return {**defaults, **{k: v for k, v in spec.items() if k != "type"}}


def mlp(spec, backend):
    """The MLP of a validated spec: its variables, their names and first values are the seeds' (the
    checkpoints it wrote load as they are)."""
    sizes, init = spec["layers"], spec["init"]
    initializer = f"truncated_normal:{init['stddev']}" if init["kind"] == "truncated_normal" else init["kind"]
    hidden = None if spec["activation"] == "none" else spec["activation"]
    names = layer_names(len(sizes) - 1, "softmax" if spec["loss"] == "softmax_cross_entropy" else "output")
    layers = [Dense(units, hidden if i < len(names) - 1 else None, kernel_initializer=initializer, name=name,
                    weight_names=("weights", "biases")) for i, (name, units) in enumerate(zip(names, sizes[1:]))]
    return LayerModel(Sequential(layers, input_shape=(sizes[0],), input_dtype=spec["dtype"]), loss=spec["loss"],
                      dtype=spec["dtype"], seed=spec["seed"], backend=backend)


def cnn(spec, backend):
    o = _options(spec, CNN_DEFAULTS)
    layers = [Reshape(o["image"])]
    for filters in o["filters"]:
        layers += [Conv2D(filters, o["kernel_size"], padding="same", activation="relu"), MaxPool2D(2, padding="same")]
    layers += [Flatten(), Dense(o["dense"], activation="relu")]
    layers += [Dropout(o["dropout"])] if o["dropout"] else []
    layers += [Dense(o["classes"] if o["outputs"] is None else o["outputs"])]
    return LayerModel(Sequential(layers, input_shape=_shape(o["inputs"])), loss=o["loss"], dtype=o["dtype"],
                      seed=o["seed"], backend=backend)


def _shape(inputs):
    """`inputs`: a width (flat rows) or a per-example shape such as [28, 28, 1]."""
    return tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)


def logistic(spec, backend):
    o = _options(spec, LOGISTIC_DEFAULTS)
    return LayerModel(Sequential([Dense(o["classes"])], input_shape=(o["inputs"],)), dtype=o["dtype"], seed=o["seed"],
                      backend=backend)


def linear(spec, backend):
    o = _options(spec, LINEAR_DEFAULTS)
    if o["loss"] not in ("mse", "huber"):
        raise InvalidArgumentError(f"model spec field 'loss' of a linear model is 'mse' or 'huber', not {o['loss']!r}")
    return LayerModel(Sequential([Dense(o["outputs"])], input_shape=(o["inputs"],)), loss=o["loss"],
                      dtype=o["dtype"], seed=o["seed"], backend=backend)


BUILDERS = {"mlp": mlp, "cnn": cnn, "logistic": logistic, "linear": linear}


def build(spec, backend="numpy"):
    """The built-in model of a validated `spec` on the ops backend `backend`; errors name the spec field."""
    try:
        return BUILDERS[spec["type"]](spec, backend)
    except (ValueError, TypeError) as exc:
        raise InvalidArgumentError(f"model spec {spec['type']!r}: {exc}") from None
