"""The chief's validation hook on its own: task metrics of the pulled parameters, the best kept as a
checkpoint of exactly those parameters, and the Prometheus gauges of the last validation."""

import numpy as np
import pytest

from zmqflow.common.checkpoints.checkpoint import Checkpoint, latest_checkpoint
from zmqflow.inputs.data_spec import fit, load_spec, load_tables, model_for_data, to_config
from zmqflow.models.registry import load_model
from zmqflow.services.worker.validation import ValidationHook

pytestmark = pytest.mark.unit


class FixedParameters:
    def __init__(self, params):
        self.params = params

    def pull(self):
        return self.params


def test_validation_metrics_best_checkpoint_and_gauges(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 2))
    (tmp_path / "points.csv").write_text("a,b,side\n" + "".join(f"{p:.3f},{q:.3f},{int(p > 0)}\n" for p, q in x))
    spec = load_spec({"files": str(tmp_path / "points.csv"), "split": {"validation": 0.25}, "features":
                      {"a": "numeric", "b": "numeric"}, "label": {"column": "side", "task": "binary"}})
    fit(spec, load_tables(spec)["train"])
    model = load_model(model_for_data(spec, {"type": "logistic"}))
    hook = ValidationHook(to_config(spec), every_steps=10, checkpoint_dir=str(tmp_path / "ckpt"))
    hook._trainer = type("Chief", (), {"resolved_config": lambda self: {"model": {"type": "logistic"}}})()
    params = model.initial_values(0)
    params["dense/kernel"] = np.array([[-5.0, 5.0], [0.0, 0.0]], np.float32)   # feature a decides: side 1 when a > 0
    hook.validate(FixedParameters(params), model, step=40)
    assert hook.best["step"] == 40 and hook.best["accuracy"] > 0.95 and hook.best["auc"] > 0.99
    saved = Checkpoint(latest_checkpoint(str(tmp_path / "ckpt" / "best")))
    np.testing.assert_array_equal(saved.read("dense/kernel")[0], params["dense/kernel"])
    worse = {**params, "dense/kernel": -params["dense/kernel"]}
    hook.validate(FixedParameters(worse), model, step=50)
    assert hook.best["step"] == 40 and hook.history[-1]["accuracy"] < 0.1
    gauges = {(f.name, s.labels.get("metric")): s.value for f in hook.families() for s in f.samples}
    assert gauges[("zmqflow_validation_global_step", None)] == 50
    assert gauges[("zmqflow_validation_metric", "accuracy")] == hook.history[-1]["accuracy"]


def test_a_chosen_metric_decides_the_best_and_seconds_or_steps_make_a_validation_due(tmp_path, monkeypatch):
    from zmqflow.common.errors import InvalidArgumentError
    rng = np.random.default_rng(1)
    x = rng.standard_normal((200, 2))
    (tmp_path / "p.csv").write_text("a,b,side\n" + "".join(f"{p:.3f},{q:.3f},{int(p > 0)}\n" for p, q in x))
    spec = load_spec({"files": str(tmp_path / "p.csv"), "split": {"validation": 0.25}, "features":
                      {"a": "numeric", "b": "numeric"}, "label": {"column": "side", "task": "binary"}})
    fit(spec, load_tables(spec)["train"])
    model = load_model(model_for_data(spec, {"type": "logistic"}))
    hook = ValidationHook(to_config(spec), every_steps=None, every_secs=5.0, monitor="log_loss")
    assert (hook.metric, hook.better) == ("log_loss", min)
    params = model.initial_values(0)
    wrong = {**params, "dense/kernel": np.array([[5.0, -5.0], [0.0, 0.0]], np.float32)}
    right = {**params, "dense/kernel": np.array([[-5.0, 5.0], [0.0, 0.0]], np.float32)}
    hook.validate(FixedParameters(wrong), model, step=10)
    hook.validate(FixedParameters(right), model, step=20)     # a lower log-loss is better: the new best
    assert hook.best["step"] == 20 and hook.best["log_loss"] < hook.history[0]["log_loss"]
    clock = [hook._last_at]
    monkeypatch.setattr("zmqflow.services.worker.validation.time.monotonic", lambda: clock[0])
    assert not hook._due(10_000)                 # no step count set: only seconds make one due
    clock[0] += 5.0
    assert hook._due(21) and not hook._due(20)   # never twice at one step
    with pytest.raises(InvalidArgumentError, match="a binary task reports accuracy, log_loss, macro_f1, auc; there "
                                                   "is no 'rmse' to monitor"):
        ValidationHook(to_config(spec), monitor="rmse")
