"""`import zmqflow` shows its lazy API (dir(), __all__, `from zmqflow import *`) before importing any of it, and
`from zmqflow import keras` is the one import a Keras user builds a network with."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_dir_and_all_list_the_lazy_api_without_importing_it():
    probe = ("import sys, zmqflow; names = dir(zmqflow); "
             "print(sorted(set(zmqflow.API) - set(names)), sorted(set(zmqflow.__all__) - set(names)), "
             "'zmqflow.jobs.job' in sys.modules, 'zmqflow.models.keras' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["[]", "[]", "False", "False"], done.stderr
    import zmqflow
    assert {"Job", "local_cluster", "serve", "ClusterSpec", "Server", "keras", "__version__"} <= set(zmqflow.__all__)
    scope = {}
    exec("from zmqflow import *", scope)
    assert scope["Job"] is zmqflow.Job and scope["keras"] is zmqflow.keras
    with pytest.raises(AttributeError, match="no attribute 'Jobb'"):
        zmqflow.Jobb


def test_a_keras_network_in_one_import():
    from zmqflow import keras
    net = keras.Sequential([keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)], input_shape=(4,))
    model = keras.LayerModel(net, loss="softmax_cross_entropy")
    assert [v.name for v in model.variables()] == ["dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"]
    numeric = keras.Input((3,), name="numeric")
    functional = keras.LayerModel(keras.Model(numeric, keras.layers.Dense(1)(numeric)), loss="mse")
    assert [v.name for v in functional.variables()] == ["dense/kernel", "dense/bias"]
    assert "mse" in keras.LOSSES
