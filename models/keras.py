"""Keras' names in one import, for a network of the library's layers (docs/models.md):

    from zmqflow import keras

    net = keras.Sequential([keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)], input_shape=(784,))
    model = keras.LayerModel(net, loss="softmax_cross_entropy")   # what zmqflow trains, checkpoints and serves

`keras.Input` and `keras.Model(inputs, outputs)` are the functional form (several inputs). This module only
gathers the names: the layers live in models/layers.py, the graphs in models/network.py, the trainable
model with its loss head in models/layer_model.py.
"""

from zmqflow.models import layers
from zmqflow.models.layer_model import HEADS, LayerModel
from zmqflow.models.layers import Input
from zmqflow.models.network import Network as Model
from zmqflow.models.network import Sequential

LOSSES = tuple(HEADS)
"""The loss heads a LayerModel takes (`loss=`), as Keras' compile(loss=...) names them here."""

__all__ = ["layers", "Input", "Model", "Sequential", "LayerModel", "LOSSES"]
