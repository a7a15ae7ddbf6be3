"""The web view's pure parts: the history ring that gives the curves, and the page's tables from a snapshot."""

import pytest

from zmqflow.jobs.status.history import History
from zmqflow.jobs.status.view import page_view

pytestmark = pytest.mark.unit


def snap(at, version, losses=(0.5, 0.7), rates=(100.0, 300.0), validation=None, steps_per_s=None):
    """A snapshot shaped as probe.snapshot makes it: one broker, one ps shard, workers' metrics rows."""
    ps = {"job": "ps", "task": 0, "address": "127.0.0.1:2", "status": "up", "service": "ps-shard",
          "detail": {"shard": 0, "version": version, "pushes_received": version, "dropped": {"stale": 1},
                     "staleness": {"0": 3, "2": 1}, **({"steps_per_s": steps_per_s} if steps_per_s else {})}}
    broker = {"job": "broker", "task": 0, "address": "127.0.0.1:1", "status": "up", "service": "queue-broker",
              "rtt_ms": 0.4, "detail": {"queues": [
                  {"container": "", "shared_name": "train", "kind": "FIFOQueue", "size": 7, "capacity": 50,
                   "closed": False, "waiting_enqueues": 0, "waiting_dequeues": 1},
                  {"container": "c", "shared_name": "big", "kind": "FIFOQueue", "size": 0, "capacity": -1,
                   "closed": True, "waiting_enqueues": 0, "waiting_dequeues": 0}]}}
    aggregator = {"job": "aggregator", "task": 0, "address": "127.0.0.1:3", "status": "up", "service": "aggregator",
                  "rtt_ms": 0.5, "detail": {"mode": "replica", "requests": 9, "failed": 1,
                                            "latency_ms": {"p50": 1.5, "p99": 4.0},
                                            "members": [{"address": "tcp://a", "healthy": True, "answers": 8},
                                                        {"address": "tcp://b", "healthy": False, "timeouts": 2}]}}
    down = {"job": "serve", "task": 0, "address": "127.0.0.1:4", "status": "down", "service": None,
            "error": "UnavailableError: no answer"}
    metrics = [{"replica": i, "metrics": f"http://w{i}", "status": "up", "loss": loss, "examples_per_second": rate,
                "global_step": version, "steps_total": version // 2} for i, (loss, rate) in enumerate(zip(losses, rates))]
    if validation:
        metrics[0].update(validation=validation[1], validation_global_step=validation[0])
    return {"time": at, "tasks": [broker, ps, aggregator, down],
            "workers": [{"replica": 0, "state": "training", "last_push_s": 0.2}], "worker_metrics": metrics}


def test_training_points_average_the_loss_and_add_up_the_rates():
    history = History(limit=10)
    history.record(snap(100.0, 40, steps_per_s=12.5))
    history.record(snap(101.0, 52, losses=(0.2, 0.4), rates=(50.0, None)))
    training = history.series()["training"]
    assert training["time"] == [100.0, 101.0] and training["global_step"] == [40, 52]
    assert training["loss"] == pytest.approx([0.6, 0.3])
    assert training["examples_per_s"] == [400.0, 50.0] and training["steps_per_s"] == [12.5, None]


def test_a_validation_is_one_point_per_global_step():
    history = History(limit=10)
    for at, version in ((1.0, 10), (2.0, 20), (3.0, 30)):
        history.record(snap(at, version, validation=(10, {"accuracy": 0.8, "loss": 0.9})))
    history.record(snap(4.0, 40, validation=(35, {"accuracy": 0.85, "loss": 0.7})))
    assert history.series()["validation"] == {"global_step": [10, 35], "accuracy": [0.8, 0.85], "loss": [0.9, 0.7]}


def test_the_ring_keeps_the_newest_points_only():
    history = History(limit=3)
    for step in range(8):
        history.record(snap(float(step), step * 10, validation=(step, {"accuracy": step / 10})))
    series = history.series()
    assert series["training"]["global_step"] == [50, 60, 70]
    assert series["validation"]["global_step"] == [5, 6, 7]
    with pytest.raises(ValueError, match="history limit"):
        History(limit=1)


def test_page_view_tables():
    view = page_view(snap(5.0, 40, validation=(30, {"accuracy": 0.9})))
    assert [(t["task"], t["status"]) for t in view["tasks"]] == [
        ("broker:0", "up"), ("ps:0", "up"), ("aggregator:0", "up"), ("serve:0", "down")]
    assert view["tasks"][3]["error"] == "UnavailableError: no answer"
    assert [(q["queue"], q["size"], q["capacity"], q["waiting_dequeues"]) for q in view["queues"]] == [
        ("train", 7, 50, 1), ("c/big", 0, None, 0)]
    assert view["shards"] == [{"shard": "ps:0", "step": 40, "steps_per_s": None, "staleness_mean": 0.5,
                               "staleness_max": 2, "pushes": 40, "dropped": 1}]
    assert view["workers"][0] == {"worker": "worker:0", "state": "training", "last_push_s": 0.2, "metrics": "up",
                                  "examples_per_s": 100.0, "loss": 0.5, "global_step": 40, "steps": 20}
    assert view["workers"][1]["state"] is None and view["workers"][1]["examples_per_s"] == 300.0
    assert view["aggregators"] == [{"aggregator": "aggregator:0", "mode": "replica", "healthy": 1, "members": 2,
                                    "requests": 9, "failed": 1, "latency_p50_ms": 1.5, "latency_p99_ms": 4.0,
                                    "rtt_ms": 0.5}]
    assert [(m["member"], m["healthy"], m["answers"], m["timeouts"]) for m in view["members"]] == [
        ("tcp://a", True, 8, 0), ("tcp://b", False, 0, 2)]
    assert view["validation"] == {"metrics": {"accuracy": 0.9}, "global_step": 30}
