"""Issue 26: over a slow link a ps client took a large pull for a lost ps. A ping's answer queues behind the
reply sent before it on the same connection, so a pull longer than the client's liveness window (13 MB over
100 Mbit/s shared by 4 workers: over 4 s, against 3 x 1 s) ended as UnavailableError and the workers exited 3.
Here a real ps holds 20 MB of variables behind a proxy that forwards 10 MB/s each way, so a pull or a push
takes about 2 s against a liveness window shrunk to 0.6 s: both must complete, and a ps stopped (SIGSTOP) in
the middle of a pull must still be found lost within a bounded time (common/rpc/client.py)."""

import json
import signal
import socket
import threading
import time

import numpy as np
import pytest

from zmqflow.common.errors import UnavailableError
from zmqflow.common.clients.ps import PsClient
from zmqflow.common.cluster.placement import place
from zmqflow.common.rpc.client import RpcClient
from zmqflow.common.wire.protocol import PsOps
from zmqflow.models.registry import load_model, model_variables

pytestmark = pytest.mark.faults

BIG_MLP = {"type": "mlp", "layers": [784, 6400, 10], "activation": "sigmoid",
           "init": {"kind": "truncated_normal", "stddev": 0.1}, "seed": 1}   # 20.3 MB of float32
RATE = 10e6          # bytes/s the proxy forwards each way
INTERVAL, LIVENESS = 0.2, 3
DRAIN_S = 4e6 / RATE  # what a stopped ps's kernel still sends: its send buffer (loopback's largest, 4 MB)


class ThrottledProxy:
    """A TCP proxy on 127.0.0.1 to `port` that forwards `rate` bytes/s each way, paced (a slow link). Its
    receive buffers are small, so what it holds is about its chunk."""

    def __init__(self, port, rate):
        self.port, self.rate = port, rate
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self._sockets = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            upstream = socket.socket()
            upstream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            upstream.connect(("127.0.0.1", self.port))
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, self.rate), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.rate), daemon=True).start()

    @staticmethod
    def _pump(source, sink, rate):
        due = time.monotonic()
        try:
            while data := source.recv(64 * 1024):
                sink.sendall(data)
                due = max(due, time.monotonic()) + len(data) / rate
                time.sleep(max(0.0, due - time.monotonic()))
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        for sock in self._sockets:
            sock.close()


@pytest.fixture(scope="module")
def big_ps(module_processes, tmp_path_factory):
    """A ps holding BIG_MLP's initial values, and a proxy that is its slow link."""
    ps = module_processes.service("zmqflow.services.ps", [
        "--task-index", "0", "--num-ps", "1", "--model", json.dumps(BIG_MLP),
        "--optimizer", json.dumps({"kind": "sgd", "learning_rate": 0.5}),
        "--checkpoint-root", str(tmp_path_factory.mktemp("checkpoints"))])
    client = PsClient([ps.endpoint], place(model_variables(BIG_MLP), 1))
    client.initialize(load_model(BIG_MLP).initial_values(1))
    for rpc in client.clients:
        rpc.close()
    proxy = ThrottledProxy(int(ps.endpoint.rsplit(":", 1)[1]), RATE)
    yield ps, proxy
    proxy.close()


def test_a_pull_slower_than_the_liveness_window_completes(big_ps):
    ps, proxy = big_ps
    with RpcClient(ps.endpoint) as direct:
        _, (expected,) = direct.call("pull", {"packed": True}, timeout=30)
    assert expected.nbytes > 20e6
    with RpcClient(proxy.endpoint, heartbeat_interval=INTERVAL, heartbeat_liveness=LIVENESS) as slow:
        started = time.monotonic()
        _, (pulled,) = slow.call("pull", {"packed": True}, timeout=30)
        took = time.monotonic() - started
    print(f"\n{pulled.nbytes / 1e6:.1f} MB pulled over the slow link in {took:.2f} s "
          f"(liveness window {INTERVAL * LIVENESS:.1f} s)")
    assert took > 2 * INTERVAL * (LIVENESS + 1), "the pull was not slower than the liveness window: no test"
    np.testing.assert_array_equal(pulled, expected)


def test_a_push_slower_than_the_liveness_window_completes(big_ps):
    ps, proxy = big_ps
    with RpcClient(ps.endpoint) as direct:
        pulled, _ = direct.call("pull", {"packed": True}, timeout=30)
    zeros = [np.zeros(shape, dtype) for dtype, shape, _ in pulled["layout"]]   # the values stay as they are
    with RpcClient(proxy.endpoint, heartbeat_interval=INTERVAL, heartbeat_liveness=LIVENESS) as slow:
        started = time.monotonic()
        result, _ = slow.call(PsOps.Push(pulled["version"], pulled["names"]), tensors=zeros, timeout=30)
        took = time.monotonic() - started
    print(f"\n{sum(z.nbytes for z in zeros) / 1e6:.1f} MB pushed over the slow link in {took:.2f} s")
    assert took > 2 * INTERVAL * (LIVENESS + 1), "the push was not slower than the liveness window: no test"
    assert result["applied"]


def test_a_ps_stopped_mid_pull_is_still_found_lost(big_ps):
    ps, proxy = big_ps
    with RpcClient(proxy.endpoint, heartbeat_interval=INTERVAL, heartbeat_liveness=LIVENESS) as slow:
        slow.ping(timeout=5)
        pending = slow.submit("pull", {"packed": True}, timeout=30)
        assert not pending.wait(0.4)
        ps.signal_group(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            with pytest.raises(UnavailableError, match="did not answer"):
                pending.result()
            took = time.monotonic() - stopped
        finally:
            ps.signal_group(signal.SIGCONT)
    print(f"\nps stopped mid-pull: found lost {took:.2f} s later")
    assert took < DRAIN_S + 2 * INTERVAL * (LIVENESS + 1)
    with RpcClient(ps.endpoint) as direct:   # woken, it answers again
        assert direct.ping(timeout=5) < 5

