"""CURVE: encrypted services that only answer authorized clients, clients that check the service's key.

A refused client gets nothing back (ZeroMQ drops its handshake): it must see
UnavailableError within its heartbeat bound, while the service keeps serving
the clients it accepts.
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from common import curve
from common.errors import InvalidArgumentError, UnavailableError
from common.processes import start_service
from common.queues import FIFOQueue
from common.rpc_client import ClientPool, RpcClient
from services.keys_command import keys as keys_command


@pytest.fixture(scope="module")
def secure_broker(keys, tmp_path_factory):
    proc = start_service("services.broker", ["--curve-dir", keys["keys"]],
                         log_dir=str(tmp_path_factory.mktemp("broker")))
    yield proc
    proc.stop()


def refused_within(endpoint, curve_dir, bound):
    start = time.monotonic()
    with RpcClient(endpoint, curve_dir=curve_dir, heartbeat_interval=0.2) as client:
        with pytest.raises(UnavailableError):
            client.call("info", timeout=10)
    assert time.monotonic() - start < bound


# ------------------------------------------------ keys


def test_keys_generate_makes_server_and_client_pairs_and_authorizes_the_clients(tmp_path):
    result = CliRunner().invoke(keys_command, ["generate", str(tmp_path / "k"), "--clients", "alice,bob"])
    assert result.exit_code == 0, result.output
    files = sorted(os.listdir(tmp_path / "k"))
    assert files == ["alice.key", "alice.key_secret", "authorized", "bob.key", "bob.key_secret", "client.key",
                     "client.key_secret", "server.key", "server.key_secret"]
    assert sorted(os.listdir(tmp_path / "k" / "authorized")) == ["alice.key", "bob.key", "client.key"]
    assert os.stat(tmp_path / "k" / "server.key_secret").st_mode & 0o077 == 0
    curve.check_dir(str(tmp_path / "k"))


def test_keys_generate_with_a_count_names_the_clients(tmp_path):
    assert CliRunner().invoke(keys_command, ["generate", str(tmp_path), "--clients", "3"]).exit_code == 0
    assert sorted(os.listdir(tmp_path / "authorized")) == ["client-2.key", "client-3.key", "client.key"]


def test_keys_generate_refuses_to_overwrite_without_force(tmp_path):
    runner = CliRunner()
    assert runner.invoke(keys_command, ["generate", str(tmp_path)]).exit_code == 0
    result = runner.invoke(keys_command, ["generate", str(tmp_path)])
    assert result.exit_code == 1 and "already holds keys; pass --force" in result.output
    assert runner.invoke(keys_command, ["generate", str(tmp_path), "--force"]).exit_code == 0


def test_a_directory_without_keys_is_a_clear_error(tmp_path):
    with pytest.raises(InvalidArgumentError, match="server.key_secret is missing"):
        curve.check_dir(str(tmp_path))
    with pytest.raises(InvalidArgumentError, match="client.key_secret is missing"):
        RpcClient("tcp://127.0.0.1:1", curve_dir=str(tmp_path))


def test_service_refuses_to_start_with_a_bad_curve_dir(tmp_path):
    out = subprocess.run([sys.executable, "-m", "services.broker", "--curve-dir", str(tmp_path)],
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
    refused_within(secure_broker.endpoint, keys["outsider"], bound=5)
    assert "refused a client: its CURVE key" in secure_broker.log()
    with RpcClient(secure_broker.endpoint, curve_dir=keys["keys"]) as client:
        assert client.call("info", timeout=5)[0]["service"] == "queue-broker"
    assert secure_broker.alive()


def test_a_client_without_curve_gets_unavailable(secure_broker):
    refused_within(secure_broker.endpoint, None, bound=5)


def test_a_client_expecting_another_service_key_gets_unavailable(secure_broker, keys):
    refused_within(secure_broker.endpoint, keys["other"], bound=5)  # an impostor service looks the same


def test_a_second_authorized_client_pair_is_accepted(secure_broker, keys, tmp_path):
    import shutil
    shutil.copy(os.path.join(keys["keys"], "server.key"), tmp_path)
    for suffix in (".key", ".key_secret"):
        shutil.copy(os.path.join(keys["keys"], "client-2" + suffix), tmp_path / ("client" + suffix))
    with RpcClient(secure_broker.endpoint, curve_dir=str(tmp_path)) as client:
        assert client.ping(timeout=5) < 5


def test_clients_and_child_processes_take_the_keys_from_the_environment(secure_broker, keys):
    env = {**os.environ, curve.ENV: keys["keys"]}
    out = subprocess.run([sys.executable, "-m", "services", "ping", secure_broker.endpoint],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0 and "queue-broker up" in out.stdout, out.stdout + out.stderr
    cmd = [sys.executable, "-c", "from common.rpc_client import RpcClient; import sys; "
           f"print(RpcClient({secure_broker.endpoint!r}).call('info', timeout=5)[0]['curve'])"]
    assert subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env).stdout.strip() == "True"


def test_services_started_with_the_environment_variable_use_curve(keys, tmp_path):
    proc = start_service("services.broker", log_dir=str(tmp_path), env={curve.ENV: keys["keys"]})
    try:
        refused_within(proc.endpoint, None, bound=5)
        assert "with CURVE" in proc.log()
        with RpcClient(proc.endpoint, curve_dir=keys["keys"]) as client:
            assert client.call("info", timeout=5)[0]["curve"] is True
    finally:
        proc.stop()
