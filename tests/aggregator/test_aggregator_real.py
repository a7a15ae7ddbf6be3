"""A real aggregator over real model servers (checkpoints of the MNIST MLP): combined answers, a killed member, CLIs."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from zmqflow.bench.serve import write_random_checkpoint
from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.models.spec import MNIST_MLP
from zmqflow.models.registry import load_model
from zmqflow.common.processes.children import start_service
from zmqflow.common.clients.serve import ModelClient
from zmqflow.services.aggregator.cli import parse_member
from tests.support import wait_for

pytestmark = pytest.mark.integration



@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Three model servers, each on its own checkpoint (seeds 1, 2, 3)."""
    procs = []
    try:
        for seed in (1, 2, 3):
            ckpt = str(tmp_path_factory.mktemp(f"ckpt{seed}"))
            write_random_checkpoint(ckpt, seed)
            procs.append(start_service("zmqflow.services.serve", ["--checkpoint", ckpt, "--backend", "numpy",
                                                          "--max-delay-secs", "0.001"],
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


@pytest.fixture
def victim(tmp_path):
    """start(bind) -> a model server on its own checkpoint (seed 4), to kill, pause or restart; all killed at the end."""
    ckpt = str(tmp_path / "victim")
    write_random_checkpoint(ckpt, 4)
    procs = []

    def start(bind="tcp://127.0.0.1:*"):
        procs.append(start_service("zmqflow.services.serve", ["--checkpoint", ckpt, "--backend", "numpy"], bind=bind,
                                   log_dir=str(tmp_path)))
        return procs[-1]
    yield start
    for proc in procs:
        proc.kill()  # SIGKILL also ends a stopped process


@pytest.mark.faults
def test_a_killed_member_is_known_at_once_by_its_dropped_connection(servers, aggregator, victim):
    dead = victim()
    _, client = aggregator([servers[0], dead], "--deadline-ms", "5000", "--unhealthy-after", "3")
    x = np.random.default_rng(1).random((2, 784), dtype=np.float32)
    assert len(client.predict(x)[1]["answered"]) == 2
    dead.kill()
    state = lambda: client.members()[1]  # noqa: E731
    wait_for(lambda: not state()["healthy"])  # no request needed, no timeout waited for
    assert state()["last_failure"] == "disconnected" and state()["timeouts"] == 0
    probs, info = client.predict(x)
    # skipped as unhealthy, not waited for until the 5 s deadline (that would say "timeout")
    assert info["answered"] == [servers[0].endpoint] and info["missing"] == {dead.endpoint: "unhealthy"}
    assert client.stats()["timeouts"].get(dead.endpoint, 0) == 0
    np.testing.assert_allclose(probs, local(1, x), rtol=1e-5, atol=1e-6)


@pytest.mark.faults
def test_a_restarted_member_is_probed_back_after_its_disconnect(servers, aggregator, victim):
    first = victim()
    _, client = aggregator([servers[0], first], "--deadline-ms", "2000", "--probe-every-secs", "0.1")
    x = np.random.default_rng(2).random((1, 784), dtype=np.float32)
    assert len(client.predict(x)[1]["answered"]) == 2
    first.kill()
    wait_for(lambda: not client.members()[1]["healthy"])
    victim(bind=first.endpoint)  # the same address, a new process
    wait_for(lambda: client.members()[1]["healthy"], timeout=10.0)
    assert client.members()[1]["recoveries"] == 1
    assert sorted(client.predict(x)[1]["answered"]) == sorted([servers[0].endpoint, first.endpoint])


@pytest.mark.faults
def test_a_paused_member_times_out_until_unhealthy(servers, aggregator, victim):
    """SIGSTOP keeps the connection up: only the deadline tells, and after --unhealthy-after of them it is skipped."""
    paused = victim()
    _, client = aggregator([servers[0], paused], "--deadline-ms", "200", "--unhealthy-after", "2")
    x = np.random.default_rng(1).random((2, 784), dtype=np.float32)
    assert len(client.predict(x)[1]["answered"]) == 2
    paused.proc.send_signal(signal.SIGSTOP)
    for _ in range(2):
        probs, info = client.predict(x)   # answered at the deadline: the paused member is "timeout"
        assert info["answered"] == [servers[0].endpoint] and info["missing"] == {paused.endpoint: "timeout"}
        np.testing.assert_allclose(probs, local(1, x), rtol=1e-5, atol=1e-6)
    assert client.predict(x)[1]["missing"] == {paused.endpoint: "unhealthy"}   # skipped, not waited for
    stats = client.stats()
    assert stats["timeouts"][paused.endpoint] == 2 and stats["answers"][servers[0].endpoint] == 4


def test_replica_mode_over_real_members(servers, aggregator):
    _, client = aggregator(servers, "--mode", "replica")
    x = np.random.default_rng(2).random((1, 784), dtype=np.float32)
    pending = [client.predict_async(x) for _ in range(9)]
    answered = [p.result()[1]["answered"][0] for p in pending]
    assert set(answered) == {s.endpoint for s in servers}


def test_member_option_parsing_and_the_command_lines():
    assert parse_member("tcp://h:1=2.5") == ("tcp://h:1", 2.5)
    assert parse_member("tcp://h:1") == ("tcp://h:1", 1.0)
    from zmqflow.cli.main import main
    result = CliRunner().invoke(main, ["aggregator", "--help"])
    assert result.exit_code == 0 and "--member" in result.output and "--probe-every-secs" in result.output
    result = CliRunner().invoke(main, ["aggregator", "--member", "tcp://h:1=heavy"])
    assert result.exit_code == 2 and "not a number" in result.output
    out = subprocess.run([sys.executable, "-m", "zmqflow.services.aggregator", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "--unhealthy-after" in out.stdout
    assert CliRunner().invoke(main, ["bench", "serve", "--help"]).exit_code == 0


def test_the_aggregator_answers_ping_and_stops_cleanly(servers, tmp_path):
    proc = start_service("zmqflow.services.aggregator", ["--member", servers[0].endpoint], log_dir=str(tmp_path))
    try:
        with AggregatorClient(proc.endpoint) as client:
            assert client.rpc.ping() > 0   # a round trip in seconds; raises UnavailableError if unanswered
            assert client.members()[0]["address"] == servers[0].endpoint
        with ModelClient(servers[0].endpoint) as direct:
            assert direct.model_info()["inputs"] == 784
    finally:
        assert proc.stop() == 0, proc.log()
    assert json.loads(json.dumps(parse_member("a:1=0")))[1] == 0.0
