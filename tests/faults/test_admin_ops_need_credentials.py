"""Issue: without CURVE any local process could shut down or re-initialise a ps. Admin ops need a credential:
a rogue local process (no token, no CURVE key) cannot stop or reset a training job, which trains on; a
service SIGKILLed and started again on its port makes a new token, so the one it left behind is refused."""

import json
import os
import subprocess
import sys
import time

import pytest

from zmqflow.common.rpc import admin_token
from zmqflow.common.errors import PermissionDeniedError
from zmqflow.common.processes.children import start_service
from zmqflow.common.clients.ps import PsShardClient
from zmqflow.common.rpc.client import RpcClient
from zmqflow.inputs.datasets import mnist_split, write_record_shards
from zmqflow.models.spec import MNIST_MLP
from tests.support import free_port, wait_for

pytestmark = pytest.mark.faults

ROGUE = """
import sys
from zmqflow.common.errors import OpError
from zmqflow.common.rpc.client import RpcClient
ps, broker = sys.argv[1:3]
for address, op, args in ((ps, "shutdown", {}), (ps, "init", {"step": 0, "names": [], "force": True}),
                          (ps, "restore", {"dir": "/tmp"}), (broker, "reset", {"container": ""}),
                          (broker, "shutdown", {})):
    with RpcClient(address) as client:
        try:
            client.call(op, args, timeout=5)
            print("ACCEPTED", op)
        except OpError as exc:
            print(type(exc).__name__, op)
"""


def test_a_rogue_local_process_cannot_stop_or_reset_a_training_job(processes, tmp_path):
    (x, y), _ = mnist_split()
    write_record_shards(x, y, str(tmp_path / "shards"))
    broker = processes.service("zmqflow.services.broker")
    ps = processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])
    processes.process("zmqflow.services.reader", [
        "--broker", broker.endpoint, "--preset", "mnist-shards", "--files", str(tmp_path / "shards" / "*.bin"),
        "--num-epochs", "500", "--capacity", "1000"])
    worker = processes.process("zmqflow.services.worker", ["--broker", broker.endpoint, "--ps", ps.endpoint,
                                                           "--backend", "numpy", "--log-every", "20"])
    with PsShardClient(ps.endpoint) as shard:
        wait_for(lambda: shard.stats()["version"] >= 20, 60, "the job to train 20 steps")
        env = {k: v for k, v in os.environ.items() if k not in (admin_token.ENV, admin_token.FILE_ENV)}
        env[admin_token.RUNTIME_ENV] = str(tmp_path / "rogue-runtime")      # none of the job's files either
        started = time.monotonic()
        rogue = subprocess.run([sys.executable, "-c", ROGUE, ps.endpoint, broker.endpoint], env=env,
                               capture_output=True, text=True, timeout=60)
        took = time.monotonic() - started
        before = shard.stats()["version"]
        wait_for(lambda: shard.stats()["version"] >= before + 20, 20, "the job to train on after the rogue's ops")
    print(f"\nrogue's 5 admin ops refused in {took:.2f} s (process start included); the job trained on from "
          f"step {before}")
    assert rogue.returncode == 0, rogue.stderr[-2000:]
    assert rogue.stdout.split("\n")[:5] == ["UnauthenticatedError shutdown", "UnauthenticatedError init",
                                            "UnauthenticatedError restore", "UnauthenticatedError reset",
                                            "UnauthenticatedError shutdown"], rogue.stdout
    assert worker.alive() and ps.alive() and broker.alive()
    assert took < 15.0


def test_a_restarted_service_makes_a_new_token_and_the_one_left_behind_is_refused(tmp_path):
    port = free_port()
    bind = f"tcp://127.0.0.1:{port}"
    plain = {admin_token.ENV: ""}                        # no job token: each start makes its own
    first = start_service("zmqflow.services.broker", bind=bind, env=plain, log_dir=str(tmp_path))
    second = None
    try:
        path = admin_token.token_file(first.endpoint)
        old = admin_token.read_token_file(path)
        first.kill()                                      # SIGKILL: its file stays behind
        assert os.path.exists(path)
        killed = time.monotonic()
        second = start_service("zmqflow.services.broker", bind=bind, env=plain, log_dir=str(tmp_path))
        back = time.monotonic() - killed
        new = admin_token.read_token_file(path)
        assert new != old
        with RpcClient(second.endpoint, admin_token=old) as stale, pytest.raises(PermissionDeniedError):
            stale.call("reset", {"container": ""}, timeout=5)
        with RpcClient(second.endpoint) as client:       # the file the new broker wrote
            client.call("reset", {"container": ""}, timeout=5)
            client.call("shutdown", {}, timeout=5)
        assert second.proc.wait(10) == 0 and not os.path.exists(path)
        print(f"\nbroker restarted on port {port} {back:.2f} s after its SIGKILL with a new token; the old one "
              "refused (PERMISSION_DENIED)")
        assert back < 15.0
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.stop()
