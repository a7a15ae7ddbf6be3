"""CURVE: encrypted services that only answer authorized clients, clients that check the service's key.

A refused client gets nothing back (ZeroMQ drops its handshake): it must see
UnavailableError within its heartbeat bound, while the service keeps serving
the clients it accepts.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from zmqflow.common.rpc import encryption as curve
from zmqflow.common.errors import InvalidArgumentError, UnavailableError
from zmqflow.common.clients.queues import FIFOQueue
from zmqflow.common.rpc.resolver import Resolver
from zmqflow.common.rpc.client import ClientPool, RpcClient
from zmqflow.cli.keys import keys as keys_command

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def secure_broker(keys, module_processes):
    return module_processes.service("zmqflow.services.broker", ["--curve-dir", keys["keys"]])


def refused_at_once(endpoint, curve_dir):
    """UnavailableError found by the client itself (no connection, pings unanswered for 0.6 s), not by
    waiting out the call's 10 s deadline: a refused handshake is noticed within the heartbeat bound."""
    with RpcClient(endpoint, curve_dir=curve_dir, heartbeat_interval=0.2) as client:
        with pytest.raises(UnavailableError) as refused:
            client.call("info", timeout=10)
    assert "within its deadline" not in str(refused.value), refused.value


# ------------------------------------------------ keys


@pytest.mark.unit
def test_keys_generate_makes_server_and_client_pairs_and_authorizes_the_clients(tmp_path):
    result = CliRunner().invoke(keys_command, ["generate", str(tmp_path / "k"), "--clients", "alice,bob"])
    assert result.exit_code == 0, result.output
    files = sorted(os.listdir(tmp_path / "k"))
    assert files == ["alice.key", "alice.key_secret", "authorized", "bob.key", "bob.key_secret", "client.key",
                     "client.key_secret", "server.key", "server.key_secret"]
    assert sorted(os.listdir(tmp_path / "k" / "authorized")) == ["alice.key", "bob.key", "client.key"]
    assert os.stat(tmp_path / "k" / "server.key_secret").st_mode & 0o077 == 0
    curve.check_dir(str(tmp_path / "k"))


@pytest.mark.unit
def test_keys_generate_with_a_count_names_the_clients(tmp_path):
    assert CliRunner().invoke(keys_command, ["generate", str(tmp_path), "--clients", "3"]).exit_code == 0
    assert sorted(os.listdir(tmp_path / "authorized")) == ["client-2.key", "client-3.key", "client.key"]


@pytest.mark.unit
def test_keys_generate_refuses_to_overwrite_without_force(tmp_path):
    runner = CliRunner()
    assert runner.invoke(keys_command, ["generate", str(tmp_path)]).exit_code == 0
    result = runner.invoke(keys_command, ["generate", str(tmp_path)])
    assert result.exit_code == 1 and "already holds keys; pass --force" in result.output
    assert runner.invoke(keys_command, ["generate", str(tmp_path), "--force"]).exit_code == 0


@pytest.mark.unit
def test_a_directory_without_keys_is_a_clear_error(tmp_path):
    with pytest.raises(InvalidArgumentError, match="server.key_secret is missing"):
        curve.check_dir(str(tmp_path))
    with pytest.raises(InvalidArgumentError, match="client.key_secret is missing"):
        RpcClient("tcp://127.0.0.1:1", curve_dir=str(tmp_path))


def test_service_refuses_to_start_with_a_bad_curve_dir(tmp_path):
    out = subprocess.run([sys.executable, "-m", "zmqflow.services.broker", "--curve-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "server.key_secret is missing" in out.stderr


# ------------------------------------------------ accepted and refused clients


def test_an_authorized_client_uses_the_broker_over_curve(secure_broker, keys):
    pool = ClientPool(curve_dir=keys["keys"])
    try:
        q = FIFOQueue(10, ["float32", "int32"], shapes=[[3], []], shared_name="secret", broker=secure_broker.endpoint,
                      pool=pool)
        q.enqueue_many([np.ones((4, 3), np.float32), np.arange(4, dtype=np.int32)])
        x, y = q.dequeue_many(4, timeout=5)
        assert x.sum() == 12 and y.tolist() == [0, 1, 2, 3]
        info = pool.get(secure_broker.endpoint).call("info", timeout=5)[0]
        assert info["curve"] is True
    finally:
        pool.close_thread()


def test_a_client_key_not_in_authorized_gets_unavailable_and_others_are_still_served(secure_broker, keys):
    refused_at_once(secure_broker.endpoint, keys["outsider"])
    assert "refused a client: its CURVE key" in secure_broker.log()
    with RpcClient(secure_broker.endpoint, curve_dir=keys["keys"]) as client:
        assert client.call("info", timeout=5)[0]["service"] == "queue-broker"
    assert secure_broker.alive()


def test_a_service_named_by_host_name_is_checked_by_its_key_at_the_resolved_address(secure_broker, keys):
    """Clients connect to the address a name resolves to (common/rpc/resolver.py): CURVE checks keys, not names."""
    port = secure_broker.endpoint.rsplit(":", 1)[1]
    named = Resolver(getaddrinfo=lambda host, port, type=0: [(socket.AF_INET, socket.SOCK_STREAM, 6, "",
                                                                 ("127.0.0.1", 0))])
    with RpcClient(f"tcp://queue-broker:{port}", curve_dir=keys["keys"], resolver=named) as client:
        assert client.call("info", timeout=5)[0]["curve"] is True
        assert client.endpoint == f"tcp://127.0.0.1:{port}"
    with RpcClient(f"tcp://queue-broker:{port}", curve_dir=keys["other"], resolver=named,
                   heartbeat_interval=0.2) as impostor_check:
        with pytest.raises(UnavailableError):
            impostor_check.call("info", timeout=10)


def test_a_client_without_curve_gets_unavailable(secure_broker):
    refused_at_once(secure_broker.endpoint, None)


def test_a_client_expecting_another_service_key_gets_unavailable(secure_broker, keys):
    refused_at_once(secure_broker.endpoint, keys["other"])  # an impostor service looks the same


def test_a_second_authorized_client_pair_is_accepted(secure_broker, keys, tmp_path):
    import shutil
    shutil.copy(os.path.join(keys["keys"], "server.key"), tmp_path)
    for suffix in (".key", ".key_secret"):
        shutil.copy(os.path.join(keys["keys"], "client-2" + suffix), tmp_path / ("client" + suffix))
    with RpcClient(secure_broker.endpoint, curve_dir=str(tmp_path)) as client:
        client.ping(timeout=5)  # answered: UnavailableError otherwise


def test_clients_and_child_processes_take_the_keys_from_the_environment(secure_broker, keys):
    env = {**os.environ, curve.ENV: keys["keys"]}
    out = subprocess.run([sys.executable, "-m", "zmqflow", "ping", "--address", secure_broker.endpoint],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0 and "queue-broker up" in out.stdout, out.stdout + out.stderr
    cmd = [sys.executable, "-c", "from zmqflow.common.rpc.client import RpcClient; import sys; "
           f"print(RpcClient({secure_broker.endpoint!r}).call('info', timeout=5)[0]['curve'])"]
    assert subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env).stdout.strip() == "True"


def test_services_started_with_the_environment_variable_use_curve(keys, processes):
    proc = processes.service("zmqflow.services.broker", env={curve.ENV: keys["keys"]})
    refused_at_once(proc.endpoint, None)
    assert "with CURVE" in proc.log()
    with RpcClient(proc.endpoint, curve_dir=keys["keys"]) as client:
        assert client.call("info", timeout=5)[0]["curve"] is True


# ------------------------------------------------ --curve-dir on the client commands


def zmqflow(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "zmqflow", *args], capture_output=True, text=True,
                          timeout=timeout, env={k: v for k, v in os.environ.items() if k != curve.ENV} | (env or {}))


def test_ping_and_queues_take_the_client_keys_from_curve_dir(secure_broker, keys):
    assert zmqflow("ping", "--address", secure_broker.endpoint, "--timeout-secs", "1").returncode == 1  # no keys: no answer
    out = zmqflow("ping", "--curve-dir", keys["keys"], "--address", secure_broker.endpoint)
    assert out.returncode == 0 and "queue-broker up" in out.stdout, out.stdout + out.stderr
    out = zmqflow("queues", "--curve-dir", keys["keys"], "--address", secure_broker.endpoint, "--json")
    assert out.returncode == 0, out.stderr


def test_a_client_command_needs_only_the_client_pair_and_the_service_key(secure_broker, keys):
    out = zmqflow("ping", "--curve-dir", keys["outsider"], "--address", secure_broker.endpoint, "--timeout-secs", "1")
    assert out.returncode == 1 and "Invalid value" not in out.stderr  # keys accepted as a client's, then refused


@pytest.mark.parametrize("command", [["worker"], ["reader"], ["status"], ["loadtest"], ["ping"], ["queues"],
                                     ["cluster", "check"], ["train"], ["sweep"], ["ensemble"], ["up"]])
def test_every_client_command_checks_its_curve_dir(command, tmp_path):
    out = zmqflow(*command, "--curve-dir", str(tmp_path))  # refused before anything starts
    assert out.returncode == 2 and "key_secret is missing" in out.stderr, out.stderr


@pytest.mark.integration
def test_train_runs_the_whole_job_over_curve(keys, tmp_path):
    out = zmqflow("train", "--curve-dir", keys["keys"], "--epochs", "1", "--json", timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["examples"] == 4500
    logs = "".join(open(os.path.join(summary["log_dir"], name), errors="replace").read()
                   for name in os.listdir(summary["log_dir"]) if name.endswith(".log"))
    assert logs.count("with CURVE") >= 2, logs[-3000:]  # the broker and the ps shard served encrypted
