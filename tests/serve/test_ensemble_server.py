"""An ensemble inside one model server (`zmqflow serve --checkpoint A --checkpoint B --checkpoint C`): each checkpoint
on its own device (CPU slots here), combined in process with the aggregator's own functions, answering exactly as an
aggregator in front of three model servers of the same checkpoints does. Real processes over ZeroMQ."""

import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from zmqflow.cli.main import main
from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.clients.serve import ModelClient
from zmqflow.inputs.data_spec import load_spec
from zmqflow.models.combine import combine
from tests.support.tabular import checkpoint, spec_dict, write_csv

pytestmark = pytest.mark.service

MEMBERS = (("mlp-a", "mlp"), ("logistic-b", "logistic"), ("mlp-c", "mlp"))   # three models of one task
RECORDS = {"age": [55.0, 25.5, 40.0, 33.0], "size": [0.1, -1.0, 2.0, 0.5], "city": ["rome", "oslo", "lisbon", "paris"]}
SERVE = ["--backend", "numpy", "--max-delay-secs", "0.001"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensemble-server")
    write_csv(root / "train.csv", 120, seed=0)
    spec = load_spec(spec_dict(root / "train.csv"))
    for seed, (name, model) in enumerate(MEMBERS, 1):
        checkpoint(root / name, spec, model, seed=seed)
    checkpoint(root / "regression", load_spec(spec_dict(root / "train.csv", task="regression")), "linear", seed=4)
    return [str(root / name) for name, _ in MEMBERS]


@pytest.fixture(scope="module")
def both(checkpoints, module_processes):
    """(the ensemble server, the aggregator in front of three model servers) of the same three checkpoints."""
    ensemble = module_processes.service("zmqflow.services.serve", [
        *(a for c in checkpoints for a in ("--checkpoint", c)), "--combine", "mean",
        "--devices", "/cpu:0,/cpu:0,/cpu:0", *SERVE])
    members = [module_processes.service("zmqflow.services.serve", ["--checkpoint", c, *SERVE]) for c in checkpoints]
    aggregator = module_processes.service("zmqflow.services.aggregator", [
        *(a for m in members for a in ("--member", m.endpoint)), "--deadline-ms", "5000", "--min-members", "3"])
    return ensemble.endpoint, aggregator.endpoint, [m.endpoint for m in members]


@pytest.mark.parametrize("how", ["mean", "vote", "median"])
def test_the_ensemble_server_answers_as_the_aggregator_in_front_of_three_servers(both, how):
    ensemble, aggregator, _ = both
    with AggregatorClient(ensemble, timeout=10) as inside, AggregatorClient(aggregator, timeout=10) as outside:
        mine, info = inside.predict_records(RECORDS, combine=how, min_members=3)
        theirs, their_info = outside.predict_records(RECORDS, combine=how, min_members=3)
    np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    assert mine.shape == (4, 2) and info["predicted"] == their_info["predicted"]
    assert set(info["predicted"]) <= {"cat", "dog"}                    # classification, named by the task
    assert {k: info[k] for k in ("mode", "combine", "missing", "min_members")} == \
        {k: their_info[k] for k in ("mode", "combine", "missing", "min_members")} == \
        {"mode": "ensemble", "combine": how, "missing": {}, "min_members": 3}
    assert info["answered"] == [name for name, _ in MEMBERS] and len(their_info["answered"]) == 3


def test_a_model_servers_client_and_tensors_work_too_and_members_say_their_devices(both):
    ensemble, aggregator, _ = both
    with ModelClient(ensemble, timeout=10) as client, AggregatorClient(aggregator, timeout=10) as outside:
        described = client.model_info()
        x = np.random.default_rng(0).random([3] + described["schema"]["inputs"][0]["shape"], dtype=np.float32)
        mine, info = client.predict(x)            # the server's default combine: mean of all three
        theirs, _ = outside.predict(x, min_members=3)
        one, replica = client.rpc.call(*_replica(x))[::-1]
    np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    assert "predicted" not in info and info["combine"] == "mean"
    assert [(m["name"], m["device"]) for m in described["members"]] == \
        [(name, "/device:CPU:0") for name, _ in MEMBERS]
    assert described["combine"] == "mean" and described["schema"]["output"]["task"] == "multiclass"
    assert len(replica["answered"]) == 1 and one[0].shape == (3, 2)


def test_weights_count_as_the_aggregators_member_weights(both, checkpoints, module_processes):
    _, _, members = both
    ensemble = module_processes.service("zmqflow.services.serve", [
        *(a for c in checkpoints for a in ("--checkpoint", c)), "--combine", "weighted", "--weights", "1,2,3.5", *SERVE])
    aggregator = module_processes.service("zmqflow.services.aggregator", [
        *(a for m, w in zip(members, (1, 2, 3.5)) for a in ("--member", f"{m}={w}")), "--combine", "weighted",
        "--deadline-ms", "5000", "--min-members", "3"])
    with AggregatorClient(ensemble.endpoint, timeout=10) as inside, \
            AggregatorClient(aggregator.endpoint, timeout=10) as outside:
        mine, info = inside.predict_records(RECORDS)
        theirs, their_info = outside.predict_records(RECORDS)
        plain, _ = inside.predict_records(RECORDS, combine="mean")
    np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    assert info["predicted"] == their_info["predicted"] and info["combine"] == "weighted"
    assert not np.allclose(mine, plain)          # the weights count


def _replica(x):
    from zmqflow.common.wire.protocol import AggregatorOps
    return AggregatorOps.Predict(mode="replica"), None, [x]


def test_combining_is_the_aggregators_own_function():
    answers = [np.array([[0.2, 0.8]], np.float32), np.array([[0.6, 0.4]], np.float32)]
    np.testing.assert_allclose(combine("mean", answers), [[0.4, 0.6]])
    from zmqflow.services.aggregator import gather
    from zmqflow.services.serve import ensemble
    assert gather.combine_answers is ensemble.combine_answers   # one home: models/combine.py


def test_bad_ensemble_options_are_named(checkpoints, tmp_path):
    result = CliRunner().invoke(main, ["serve", "--checkpoint", checkpoints[0], "--devices", "/cpu:0"])
    assert result.exit_code == 2 and "are for an ensemble: repeat --checkpoint" in result.output
    result = CliRunner().invoke(main, ["serve", "--checkpoint", checkpoints[0], "--checkpoint", checkpoints[1],
                                       "--weights", "1,heavy"])
    assert result.exit_code == 2 and "weight 'heavy' is not a number >= 0" in result.output
    result = CliRunner().invoke(main, ["serve", "--checkpoint", checkpoints[0], "--checkpoint", checkpoints[1],
                                       "--devices", "/cpu:0"])
    assert result.exit_code == 2 and "1 devices for 2 checkpoints" in result.output
    out = subprocess.run([sys.executable, "-m", "zmqflow", "serve", "--checkpoint", checkpoints[0], "--checkpoint",
                          checkpoints[1], "--devices", "/cpu:0,/gpu:7", "--bind", "127.0.0.1:0", *SERVE],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"checkpoint {checkpoints[1]}: device '/gpu:7'" in out.stderr, out.stderr
    regression = os.path.join(os.path.dirname(checkpoints[0]), "regression")
    out = subprocess.run([sys.executable, "-m", "zmqflow", "serve", "--checkpoint", checkpoints[0], "--checkpoint",
                          regression, "--bind", "127.0.0.1:0", *SERVE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"checkpoint {regression} cannot answer with {checkpoints[0]}" in out.stderr, \
        out.stderr


def test_bench_serve_measures_the_in_process_ensemble(tmp_path):
    from zmqflow.bench.serve import in_process_ensemble, write_random_checkpoint
    ckpts = [str(tmp_path / f"ckpt{i}") for i in range(3)]
    for seed, ckpt in enumerate(ckpts, 1):
        write_random_checkpoint(ckpt, seed)
    said = []
    found = in_process_ensemble(ckpts, np.zeros((1, 784), np.float32), 100, 0.5, str(tmp_path), said.append)
    assert found["ensemble3_errors"] == 0 and 0 < found["ensemble3_p50_ms"] <= found["ensemble3_p99_ms"]
    assert found["ensemble3_cpu_us_per_request"] > 0 and "combined in process" in said[0]


def test_each_checkpoint_is_reloaded_when_a_newer_one_is_written(tmp_path, module_processes):
    from tests.support import wait_for
    from zmqflow.bench.serve import write_random_checkpoint
    from zmqflow.models.registry import load_model
    from zmqflow.models.spec import MNIST_MLP
    ckpts = [str(tmp_path / "a"), str(tmp_path / "b")]
    for seed, ckpt in enumerate(ckpts, 1):
        write_random_checkpoint(ckpt, seed)
    proc = module_processes.service("zmqflow.services.serve", [
        "--checkpoint", ckpts[0], "--checkpoint", ckpts[1], "--refresh-secs", "0.2", *SERVE])
    model, x = load_model(MNIST_MLP), np.random.default_rng(1).random((2, 784), dtype=np.float32)
    local = {seed: model.predict(model.initial_values(seed), x) for seed in (1, 2, 5)}
    with ModelClient(proc.endpoint, timeout=10) as client:
        np.testing.assert_allclose(client.predict(x)[0], (local[1] + local[2]) / 2, rtol=1e-5, atol=1e-6)
        write_random_checkpoint(ckpts[0], seed=5, step=2)
        wait_for(lambda: [m["version"] for m in client.model_info()["members"]] == [2, 1], 10, "a reloads step 2")
        np.testing.assert_allclose(client.predict(x)[0], (local[5] + local[2]) / 2, rtol=1e-5, atol=1e-6)
