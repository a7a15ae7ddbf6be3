"""Hooks in a MonitoredTrainingSession (TF's SessionRunHooks): a user's own, SummaryHook's JSON lines and
TensorBoard scalars, ValidationHook on a data spec's validation split, on a real ps task."""

import contextlib
import glob
import json
import threading

import numpy as np
import pytest
from tensorboardX.proto import event_pb2

import zmqflow
from tests.support.ports import free_port
from zmqflow.inputs.data_spec import fit, load_spec, load_tables, model_for_data, prepare
from zmqflow.inputs.formats.tfrecord import iter_records

pytestmark = pytest.mark.service


class Recorder(zmqflow.Hook):
    """A user's hook: sees begin, every step's context and the end; stops once the loss is small."""

    def __init__(self):
        self.calls, self.losses = [], []

    def begin(self, trainer):
        self.calls.append("begin")

    def after_step(self, ctx):
        self.losses.append(ctx.loss)
        return ctx.loss < 0.2

    def end(self, trainer):
        self.calls.append("end")


def points_spec(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 2))
    (tmp_path / "points.csv").write_text("a,b,side\n" + "".join(f"{p:.3f},{q:.3f},{int(p > q)}\n" for p, q in x))
    spec = load_spec({"files": str(tmp_path / "points.csv"), "split": {"validation": 0.2, "seed": 0},
                      "features": {"a": "numeric", "b": "numeric"}, "label": {"column": "side", "task": "binary"}})
    fit(spec, load_tables(spec)["train"])
    return spec


@contextlib.contextmanager
def logistic_ps(tmp_path):
    """One ps serving a logistic model of the points spec, in a thread, stopped on exit:
    (spec, its prepared train split, the cluster, the model)."""
    spec = points_spec(tmp_path)
    train = prepare(spec, load_tables(spec)["train"])
    cluster = {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"]}
    model = model_for_data(spec, {"type": "logistic"})
    ps = zmqflow.Server(cluster, "ps", 0, model=model, optimizer={"kind": "adam", "learning_rate": 0.05})
    thread = threading.Thread(target=ps.join, daemon=True)
    thread.start()
    try:
        yield spec, train, cluster, model
    finally:
        ps.service.stop()
        thread.join(timeout=10)


def test_user_summary_and_validation_hooks_in_a_session(tmp_path):
    with logistic_ps(tmp_path) as (spec, train, cluster, model):
        recorder = Recorder()
        summaries = zmqflow.SummaryHook(str(tmp_path / "summaries.jsonl"), every_n_steps=5,
                                        output_dir=str(tmp_path / "tensorboard"))
        validation = zmqflow.ValidationHook(spec, every_steps=10, summaries=summaries)
        server = zmqflow.Server(cluster, "worker", 0, model=model)
        rng = np.random.default_rng(0)
        with zmqflow.MonitoredTrainingSession(server, hooks=[recorder, summaries, validation,
                                                             zmqflow.StopAtStepHook(last_step=400)]) as sess:
            while not sess.should_stop():
                rows = rng.integers(0, train.rows, 50)
                sess.run(*train.batch(rows))
    assert recorder.calls == ["begin", "end"] and recorder.losses[-1] < 0.2 < recorder.losses[0]   # it stopped
    assert len(recorder.losses) < 400
    lines = [json.loads(line) for line in (tmp_path / "summaries.jsonl").read_text().splitlines()]
    losses = [r for r in lines if "loss" in r]
    assert [r["step"] for r in losses] == sorted(r["step"] for r in losses) and len(losses) >= len(recorder.losses) // 5
    validated = [r for r in lines if "validation" in r]
    assert validated and validated[-1]["validation"] == {k: v for k, v in validation.history[-1].items() if k != "step"}
    assert validation.history[-1]["accuracy"] > 0.9 and validation.history[-1]["step"] == sess.global_step
    events = [event_pb2.Event.FromString(r) for path in glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*"))
              for r in iter_records(path)]
    tags = {v.tag for event in events for v in event.summary.value}
    assert {"loss", "examples_per_sec", "validation/accuracy", "validation/auc"} <= tags, tags


def test_a_worker_asks_the_ps_nothing_after_it_said_done(tmp_path):
    """Once every worker said it is done, the chief's session shuts the ps down: a worker that asked the ps for
    the global step after its worker_done raced that shutdown (the classic script's worker 1 once failed with
    'did not answer for 3.0 s'). Here the ps stops the moment the worker says done, and its session still ends
    with its summary."""
    from zmqflow.common.clients.ps import PsClient, PsShardClient
    from zmqflow.models.registry import load_model
    with logistic_ps(tmp_path) as (_, train, cluster, model):
        cluster = {**cluster, "worker": cluster["worker"] + [f"127.0.0.1:{free_port()}"]}
        chief = zmqflow.Server(cluster, "worker", 0, model=model)
        built = load_model(model, "numpy")
        initializing = PsClient(chief.ps_endpoints, chief.placement(built.variables()), name="chief")
        initializing.initialize(built.initial_values(0))   # what the chief does first
        initializing.close()
        rng = np.random.default_rng(0)
        worker = zmqflow.Server(cluster, "worker", 1, model=model)
        with zmqflow.MonitoredTrainingSession(worker, hooks=[zmqflow.StopAtStepHook(last_step=20)]) as sess:
            assert not sess.trainer.is_chief
            said_done = sess.trainer.ps.worker_done

            def done_and_the_chief_shuts_the_ps_down(*args, **kwargs):
                answer = said_done(*args, **kwargs)
                with PsShardClient("tcp://" + cluster["ps"][0]) as admin:
                    admin.shutdown()
                return answer
            sess.trainer.ps.worker_done = done_and_the_chief_shuts_the_ps_down
            while not sess.should_stop():
                sess.run(*train.batch(rng.integers(0, train.rows, 50)))
        assert sess.summary["global_step"] >= 20
