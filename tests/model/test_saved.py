"""models/saved.py: the one way a checkpoint becomes a model and its parameters (evaluate, predict, export,
serve, the sweep's validation)."""

import os

import numpy as np
import pytest

from zmqflow.common.checkpoints import checkpoint as checkpoint_module
from zmqflow.common.checkpoints.checkpoint import save_params
from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.inputs.data_spec import load_spec
from zmqflow.jobs.predict import predict_file
from zmqflow.models.registry import load_model
from zmqflow.models.saved import LoadedCheckpoint
from tests.support.tabular import checkpoint, spec_dict, write_csv

pytestmark = pytest.mark.unit

LOGISTIC = {"type": "logistic", "inputs": 4, "classes": 3}


def _saved(tmp_path, spec=LOGISTIC, step=7):
    params = load_model(spec).initial_values(3)
    save_params(str(tmp_path), step, params, {"model": spec})
    return params


def test_opens_the_latest_checkpoint_of_a_directory_with_its_recorded_model(tmp_path):
    params = _saved(tmp_path)
    loaded = LoadedCheckpoint.open(tmp_path)
    assert (loaded.step, loaded.spec, loaded.data) == (7, LOGISTIC, None)
    assert loaded.path == os.path.join(str(tmp_path), "ckpt-7")
    assert sorted(loaded.params) == sorted(params)
    for name, value in params.items():
        np.testing.assert_array_equal(loaded.params[name], value)
    assert loaded.model.predict(loaded.params, np.ones((2, 4), np.float32)).shape == (2, 3)


def test_opens_one_ckpt_step_directory_as_it_is(tmp_path):
    _saved(tmp_path, step=3)
    _saved(tmp_path, step=9)
    assert LoadedCheckpoint.open(tmp_path / "ckpt-3").step == 3
    assert LoadedCheckpoint.open(tmp_path).step == 9


def test_a_given_model_spec_wins_over_the_recorded_one_and_is_checked_against_the_variables(tmp_path):
    _saved(tmp_path)
    with pytest.raises(InvalidArgumentError, match=r"variable '[^']+' is \[4, 3\] in the checkpoint, the "
                                                   r"model expects \[4, 5\]"):
        LoadedCheckpoint.open(tmp_path, {"type": "logistic", "inputs": 4, "classes": 5})
    with pytest.raises(InvalidArgumentError, match="has no variable '[^']+': was it saved from another model"):
        LoadedCheckpoint.open(tmp_path, {"type": "mlp", "layers": [4, 3]})


def test_no_checkpoint_is_not_found(tmp_path):
    with pytest.raises(NotFoundError, match="no committed checkpoint in .*: it is no ckpt-<step>"):
        LoadedCheckpoint.open(tmp_path)


def test_predict_opens_the_checkpoint_once(tmp_path, monkeypatch):
    write_csv(tmp_path / "rows.csv", 40, seed=1)
    spec = load_spec(spec_dict(tmp_path / "rows.csv"))
    checkpoint(tmp_path / "ckpt", spec, "logistic", seed=2)
    opened = []
    real = checkpoint_module.Checkpoint.__init__
    monkeypatch.setattr(checkpoint_module.Checkpoint, "__init__",
                        lambda self, path: (opened.append(path), real(self, path))[1])
    columns, rows = predict_file(str(tmp_path / "ckpt"), str(tmp_path / "rows.csv"))
    assert columns == ["class", "p_cat", "p_dog"] and len(rows) == 40
    assert len(opened) == 1, opened
