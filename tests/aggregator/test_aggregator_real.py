"""A real aggregator over real model servers (checkpoints of the MNIST MLP): combined answers, a killed member, CLIs."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from bench.serve import write_random_checkpoint
from common.aggregator_client import AggregatorClient
from common.model_spec import MNIST_MLP, load_model
from common.processes import start_service
from common.serve_client import ModelClient
from services.aggregator.cli import parse_member

SLACK = 0.1


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Three model servers, each on its own checkpoint (seeds 1, 2, 3)."""
    procs = []
    try:
        for seed in (1, 2, 3):
            ckpt = str(tmp_path_factory.mktemp(f"ckpt{seed}"))
            write_random_checkpoint(ckpt, seed)
            procs.append(start_service("services.serve", ["--checkpoint", ckpt, "--backend", "numpy",
                                                          "--max-delay-ms", "1"],
                                       log_dir=str(tmp_path_factory.mktemp("serve"))))
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def local(seed, x):
    model = load_model(MNIST_MLP)
    return model.predict(model.initial_values(seed), x)


def test_the_ensemble_is_the_mean_of_the_real_members(servers, aggregator):
    x = np.random.default_rng(0).random((4, 784), dtype=np.float32)
    _, client = aggregator(servers, "--deadline-ms", "2000", "--min-members", "3")
    probs, info = client.predict(x)
    assert sorted(info["answered"]) == sorted(s.endpoint for s in servers)
    expected = np.mean([local(seed, x) for seed in (1, 2, 3)], axis=0)
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-6)
    votes, _ = client.predict(x, combine="vote")
    np.testing.assert_allclose(votes.sum(axis=1), 1.0, rtol=1e-6)
    with pytest.raises(Exception, match="784"):  # the members' own refusal comes through
        client.predict(np.zeros((1, 10), np.float32))


def test_a_killed_member_is_answered_without_on_time_then_skipped(servers, aggregator, tmp_path):
    ckpt = str(tmp_path / "victim")
    write_random_checkpoint(ckpt, 4)
    victim = start_service("services.serve", ["--checkpoint", ckpt, "--backend", "numpy"], log_dir=str(tmp_path))
    try:
        _, client = aggregator([servers[0], victim], "--deadline-ms", "200", "--unhealthy-after", "2")
        x = np.random.default_rng(1).random((2, 784), dtype=np.float32)
        assert len(client.predict(x)[1]["answered"]) == 2
        victim.kill()
        for _ in range(2):
            start = time.monotonic()
            probs, info = client.predict(x)
            assert time.monotonic() - start < 0.2 + SLACK
            assert info["answered"] == [servers[0].endpoint] and info["missing"] == {victim.endpoint: "timeout"}
            np.testing.assert_allclose(probs, local(1, x), rtol=1e-5, atol=1e-6)
        start = time.monotonic()
        assert client.predict(x)[1]["missing"] == {victim.endpoint: "unhealthy"}
        assert time.monotonic() - start < 0.1
        stats = client.stats()
        assert stats["timeouts"][victim.endpoint] == 2 and stats["answers"][servers[0].endpoint] == 4
    finally:
        victim.kill()


def test_replica_mode_over_real_members(servers, aggregator):
    _, client = aggregator(servers, "--mode", "replica")
    x = np.random.default_rng(2).random((1, 784), dtype=np.float32)
    pending = [client.predict_async(x) for _ in range(9)]
    answered = [p.result()[1]["answered"][0] for p in pending]
    assert set(answered) == {s.endpoint for s in servers}


def test_member_option_parsing_and_the_command_lines():
    assert parse_member("tcp://h:1=2.5") == ("tcp://h:1", 2.5)
    assert parse_member("tcp://h:1") == ("tcp://h:1", 1.0)
    from services.cli import main
    result = CliRunner().invoke(main, ["aggregator", "--help"])
    assert result.exit_code == 0 and "--member" in result.output and "--probe-ms" in result.output
    result = CliRunner().invoke(main, ["aggregator", "--member", "tcp://h:1=heavy"])
    assert result.exit_code == 2 and "not a number" in result.output
    out = subprocess.run([sys.executable, "-m", "services.aggregator", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "--unhealthy-after" in out.stdout
    assert CliRunner().invoke(main, ["bench", "serve", "--help"]).exit_code == 0


def test_the_aggregator_answers_ping_and_stops_cleanly(servers, tmp_path):
    proc = start_service("services.aggregator", ["--member", servers[0].endpoint], log_dir=str(tmp_path))
    try:
        with AggregatorClient(proc.endpoint) as client:
            assert client.rpc.ping() < 1.0
            assert client.members()[0]["address"] == servers[0].endpoint
        with ModelClient(servers[0].endpoint) as direct:
            assert direct.model_info()["inputs"] == 784
    finally:
        assert proc.stop() == 0, proc.log()
    assert json.loads(json.dumps(parse_member("a:1=0")))[1] == 0.0
