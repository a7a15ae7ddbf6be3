"""Pipeline stages talking over real ZeroMQ sockets (stage 0 here, the later stages in threads, a ps
stand-in that hands out fixed parameters): a pipelined step, through a chain or a DAG of stages,
equals the whole model's, a failing
stage's error reaches stage 0, and a silent stage ends the wait within the link's timeout."""

import threading
import time

import numpy as np
import pytest

from zmqflow.common.errors import AbortedError
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Add, Concatenate, Dense, Input
from zmqflow.models.network import Network, Sequential
from zmqflow.models.stages import split_stages, start_order
from zmqflow.services.worker.stage_link import PipelineModel, StageLink, micro_slices, serve_stage

pytestmark = pytest.mark.service


@pytest.fixture(autouse=True)
def job_token(monkeypatch):
    """The stages know each other by the job's token (a launcher gives every worker one)."""
    monkeypatch.setenv("ZMQFLOW_JOB_TOKEN", "this-job")


class FixedParameters:
    """What a stage needs of a PsClient, answering with one set of parameters."""

    def __init__(self, params):
        self.params, self.versions, self.pulls = params, [7], []

    def pull(self, min_version=None, timeout=None, exclude=()):
        self.pulls.append((min_version, sorted(exclude)))
        return {k: v for k, v in self.params.items() if k not in exclude}

    def pull_async(self, min_version=None, timeout=None, exclude=()):
        pulled = self.pull(min_version, timeout, exclude)
        return type("Done", (), {"result": lambda self: pulled})()


def model(stages=3):
    devices = [f"/job:worker/task:{k}" for k in range(stages)]
    layers = [Dense(6, activation="tanh", device=devices[0]), Dense(5, activation="relu", device=devices[1]),
              Dense(4, device=devices[-1])]
    return LayerModel(Sequential(layers, input_shape=(3,)), dtype="float64", seed=2)


def start_stages(net, ps, timeout=10.0):
    """Stages 1..n-1 in threads, each listening before the stages that send to it; returns the stages,
    stage 0's link, the threads and their results."""
    stages, threads, results, endpoints = split_stages(net), [], {}, {}
    for k in start_order({s.index: s.downstream for s in stages})[:-1]:
        link = StageLink(index=k, bind="tcp://127.0.0.1:*", timeout=timeout,
                         downstream={d: endpoints[d] for d in stages[k].downstream})
        endpoints[k] = link.endpoint

        def serve(k=k, link=link):
            try:
                results[k] = serve_stage(stages[k], ps, link, net)
            except Exception as exc:
                results[k] = exc
            finally:
                link.close()
        threads.append(threading.Thread(target=serve, daemon=True))
        threads[-1].start()
    return stages, StageLink(downstream={d: endpoints[d] for d in stages[0].downstream}, timeout=timeout), \
        threads, results


def branching(join):
    """Stage 0 feeds two branches (stages 1 and 2) that stage 3 joins; stage 0's output also skips to it."""
    x = Input((3,), name="x")
    trunk = Dense(6, activation="tanh", device="/job:worker/task:0")(x)
    left = Dense(5, activation="relu", device="/job:worker/task:1")(trunk)
    right = Dense(5, activation="tanh", device="/job:worker/task:2")(trunk)
    joined = join(device="/job:worker/task:3")([left, right])
    return LayerModel(Network(x, Dense(4)(Concatenate()([joined, trunk]))), dtype="float64", seed=4)


@pytest.mark.parametrize("micro_batches, build", [(1, model), (4, model), (3, lambda: branching(Add)),
                                                  (2, lambda: branching(Concatenate))])
def test_a_pipelined_step_over_three_or_four_workers_equals_the_whole_models(micro_batches, build):
    """A chain of three stages, and a DAG of four (two branches and a join)."""
    net = build()
    params = net.initial_values()
    ps = FixedParameters(params)
    stages, link, threads, results = start_stages(net, ps)
    pipeline = PipelineModel(net, stages, link, micro_batches, versions=lambda: list(ps.versions))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((10, 3)), rng.integers(0, 4, 10)
    want_loss, want, _ = net.step(params, (x, y))
    local = {k: v for k, v in params.items() if k not in pipeline.remote_variables()}
    for _ in range(2):                                   # the second step uses the prefetched parameters
        loss, grads, metrics = pipeline.step(local, (x, y))
        assert loss == pytest.approx(want_loss, rel=1e-10) and metrics["loss"] == pytest.approx(want_loss, rel=1e-10)
        assert set(grads) == set(want)
        for name, g in want.items():
            np.testing.assert_allclose(grads[name], g, rtol=1e-8, atol=1e-12, err_msg=name)
    pipeline.finish()
    for thread in threads:
        thread.join(10)
    assert results == {k: {"batches": 2, "micro_batches": 2 * micro_batches} for k in range(1, len(stages))}
    for k in range(1, len(stages)):                                                          # each stage its own
        assert ([7], sorted(n for n in params if n not in stages[k].variable_names)) in ps.pulls


@pytest.mark.parametrize("build, failing", [(lambda: model(2), 1), (lambda: branching(Add), 3)])
def test_a_failing_stage_names_itself_to_stage_zero_and_every_stage_stops(build, failing):
    """In a chain, and at the join of a DAG, whose failure reaches stage 0 through both branches."""
    net = build()
    params = net.initial_values()
    stages, link, threads, results = start_stages(net, FixedParameters(params))
    pipeline = PipelineModel(net, stages, link, 2, versions=lambda: [0])
    local = {k: v for k, v in params.items() if k not in pipeline.remote_variables()}
    with pytest.raises(AbortedError, match=rf"stage {failing} failed: InvalidArgumentError: Received a label value "
                                           "of 9 "):
        pipeline.step(local, (np.zeros((4, 3)), np.array([0, 1, 9, 2])))
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    assert "label value of 9 which is outside the valid range" in str(results.pop(failing))
    assert all(isinstance(result, AbortedError) for result in results.values())
    pipeline.finish(RuntimeError("test over"))


def test_a_silent_stage_ends_the_wait_within_the_links_timeout():
    net = model(2)
    silent = StageLink(index=1, bind="tcp://127.0.0.1:*", timeout=5.0)   # bound, never answers
    stages = split_stages(net)
    pipeline = PipelineModel(net, stages, StageLink(next_endpoint=silent.endpoint, timeout=1.0), 2,
                             versions=lambda: [0])
    params = net.initial_values()
    started = time.monotonic()
    with pytest.raises(AbortedError, match=r"no gradient from stage 1 within 1 s"):
        pipeline.step({k: v for k, v in params.items() if k not in pipeline.remote_variables()},
                      (np.zeros((4, 3)), np.zeros(4, int)))
    assert time.monotonic() - started < 5
    pipeline.finish(RuntimeError("test over"))
    silent.close()


def test_micro_slices_cover_the_batch_in_near_equal_parts():
    assert [(s.start, s.stop) for s in micro_slices(10, 4)] == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert [(s.start, s.stop) for s in micro_slices(3, 8)] == [(0, 1), (1, 2), (2, 3)]
