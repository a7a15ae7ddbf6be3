"""The RPC base over real sockets: parking, deadlines, cancel, heartbeats, bad input."""

import threading
import time

import numpy as np
import pytest
import zmq

from zmqflow.common.wire import frames as wire
from zmqflow.common.errors import (CancelledError, DeadlineExceededError, InternalError, InvalidArgumentError,
                                   ResourceExhaustedError, UnavailableError)
from zmqflow.common.rpc.client import RpcClient
from zmqflow.common.rpc.service import PARKED, Service
from tests.support import wait_for

pytestmark = pytest.mark.service


class ToyService(Service):
    """echo answers at once; wait parks until someone calls release."""

    name = "toy"

    def __init__(self, bind="tcp://127.0.0.1:*", **kw):
        super().__init__(bind, **kw)
        self.waiting = []
        self.withdrawn = []
        self.handlers.update(echo=self._echo, wait=self._wait, release=self._release, boom=self._boom, full=self._full)

    def _echo(self, call):
        return {"args": call.args}, call.tensors

    def _wait(self, call):
        self.waiting.append(call)
        return self.park(call)

    def _release(self, call):
        released = [c for c in self.waiting if not c.finished]
        for c in released:
            self.reply(c, {"released": True})
        return {"count": len(released)}

    def _boom(self, call):
        raise RuntimeError("handler bug")

    def _full(self, call):
        """Refuses with a retry hint, at once (raised) or after parking (fail)."""
        error = ResourceExhaustedError("toy is full", {"retry_after_ms": 250})
        if not call.args.get("parked"):
            raise error
        self.park(call)
        self.fail(call, error)
        return PARKED

    def on_deadline(self, call):
        self.withdrawn.append(("deadline", call.id))
        super().on_deadline(call)

    def on_cancel(self, call, error):
        self.withdrawn.append(("cancel", call.id))
        super().on_cancel(call, error)


@pytest.fixture
def toy():
    service = ToyService(client_timeout=1.5)
    thread = threading.Thread(target=service.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    yield service
    service.stop()
    thread.join(5)


def test_echo_round_trip_of_every_dtype(toy):
    import ml_dtypes
    arrays = [np.arange(6, dtype=dt).reshape(2, 3) for dt in
              (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16)]
    arrays += [np.array([[True, False]]), np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16),
               np.array([b"a", b"", b"file-0.csv"], dtype=object), np.zeros((0, 3), np.float32),
               np.arange(200_000, dtype=np.float32)]  # large: zero-copy path
    with RpcClient(toy.endpoint) as client:
        result, out = client.call("echo", {"x": 1}, arrays, timeout=5)
    assert result == {"args": {"x": 1}}
    for a, b in zip(arrays, out):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b)
        assert b.flags.writeable


def test_many_requests_in_flight_complete_by_id(toy):
    with RpcClient(toy.endpoint) as client:
        calls = [client.submit("echo", {"i": i}) for i in range(200)]
        assert [c.result()[0]["args"]["i"] for c in reversed(calls)] == list(reversed(range(200)))


def test_parked_request_is_answered_later(toy):
    with RpcClient(toy.endpoint) as a, RpcClient(toy.endpoint) as b:
        pending = a.submit("wait", timeout=5)
        wait_for(lambda: toy.waiting, 5, "the wait request to be parked")
        assert b.call("release", timeout=5)[0] == {"count": 1}
        assert pending.result()[0] == {"released": True}


def test_service_enforces_deadline(toy):
    with RpcClient(toy.endpoint) as client:
        start = time.monotonic()
        with pytest.raises(DeadlineExceededError):
            client.call("wait", timeout=0.2)
        assert time.monotonic() - start > 0.15   # answered at the deadline, not before
    assert toy.withdrawn and toy.withdrawn[-1][0] == "deadline"


def test_cancel_withdraws_the_parked_request(toy):
    with RpcClient(toy.endpoint) as client:
        pending = client.submit("wait", timeout=5)
        pending.cancel()
        with pytest.raises(CancelledError):
            pending.result()
    assert toy.withdrawn[-1][0] == "cancel"


def test_bad_header_is_invalid_argument_and_loop_survives(toy):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(toy.endpoint)
    for garbage in ([b"\xc1not msgpack"], [wire.pack({"v": 2, "op": "echo", "id": 1})],
                    [wire.pack({"v": 1, "op": 5, "id": 1})],
                    [wire.pack({"v": 1, "op": "nope", "id": 1, "args": {}, "tensors": []})],
                    [wire.pack({"v": 1, "op": "echo", "id": 1, "args": {}, "tensors": [["float32", [10]]]}), b"x"],
                    [wire.pack({"v": 1, "op": "echo", "id": 1, "args": {}, "tensors": [["complex", [1]]]}), b"x"]):
        sock.send_multipart(garbage)
        assert sock.poll(2000)
        header = wire.unpack(sock.recv_multipart()[0])
        assert header["code"] == InvalidArgumentError.code, header
    sock.close()
    with RpcClient(toy.endpoint) as client:
        assert client.call("echo", {"ok": True}, timeout=2)[0] == {"args": {"ok": True}}


def test_an_errors_retry_hint_travels_to_the_client(toy):
    with RpcClient(toy.endpoint) as client:
        for args in ({}, {"parked": True}):
            with pytest.raises(ResourceExhaustedError, match="toy is full") as caught:
                client.call("full", args, timeout=2)
            assert caught.value.retry_after == 0.25 and caught.value.details == {"retry_after_ms": 250}
        with pytest.raises(DeadlineExceededError) as caught:
            client.call("wait", timeout=0.05)
        assert caught.value.retry_after is None and caught.value.details == {}


def test_handler_bug_is_internal_error_not_a_dead_loop(toy):
    with RpcClient(toy.endpoint) as client:   # by an id: its text stays in the log (tests/security)
        with pytest.raises(InternalError, match=r"^internal error \(id [0-9a-f]{12}; the toy's log has the details\)$"):
            client.call("boom", timeout=2)
        assert client.call("echo", timeout=2)[0] == {"args": {}}


@pytest.mark.timeout(20)
def test_dead_service_is_unavailable_not_a_hang():
    ctx = zmq.Context.instance()
    silent = ctx.socket(zmq.ROUTER)  # accepts connections, never answers
    silent.linger = 0
    silent.bind("tcp://127.0.0.1:*")
    endpoint = silent.getsockopt_string(zmq.LAST_ENDPOINT)
    with RpcClient(endpoint, heartbeat_interval=0.1, heartbeat_liveness=3) as client:
        with pytest.raises(UnavailableError, match=endpoint.replace("*", r"\*")):
            client.call("echo")   # no timeout: only the heartbeats can end it (the test's own timeout says hang)
    silent.close()


def test_silent_client_loses_its_parked_requests(toy):
    client = RpcClient(toy.endpoint)
    client.submit("wait", timeout=30)  # submitted, then never waited on: no pings
    wait_for(lambda: toy.withdrawn, 5, "the silent client's request to be withdrawn")
    assert toy.withdrawn[0][0] == "cancel"
    client.close()


def test_bye_cancels_parked_requests(toy):
    client = RpcClient(toy.endpoint)
    client.submit("wait", timeout=30)
    wait_for(lambda: toy.waiting, 2, "the wait request to be parked")
    client.close()
    wait_for(lambda: toy.withdrawn, 2, "the request to be withdrawn after bye")
    assert toy.withdrawn == [("cancel", toy.waiting[0].id)]


def test_a_client_not_pumped_for_a_while_is_not_taken_for_dead(toy):
    with RpcClient(toy.endpoint, heartbeat_interval=0.1, heartbeat_liveness=3) as a, RpcClient(toy.endpoint) as b:
        pending = a.submit("wait", timeout=10)
        time.sleep(0.6)  # its owner was busy elsewhere: nobody read this socket for 6 intervals
        b.call("release", timeout=5)
        assert pending.result()[0] == {"released": True}


def test_answers_that_came_while_the_callers_thread_was_held_up_are_taken_not_called_lost(tmp_path):
    """The caller's thread stopped (the GIL, the CPU) after its ping went out, and the service's answers came
    meanwhile. On ipc:// no TCP counter says bytes moved, so only reading the socket shows it is alive: the
    client reads what is there before it calls the service lost."""
    service = ToyService(bind=f"ipc://{tmp_path}/toy", client_timeout=1.5)
    thread = threading.Thread(target=service.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    window = 0.1 * 3

    class HeldUp(RpcClient):
        held = False

        def _receive_within(self, timeout_ms):
            if self._unanswered_since is not None and not self.held:   # a ping is out: this thread stops here
                self.held = True
                with RpcClient(service.endpoint) as other:
                    other.call("release", timeout=5)                   # the answer comes while it is stopped
                time.sleep(window + 0.3)
                return
            super()._receive_within(timeout_ms)

    try:
        with HeldUp(service.endpoint, heartbeat_interval=0.1, heartbeat_liveness=3) as client:
            assert client.call("wait", timeout=10)[0] == {"released": True}
            assert client.held
    finally:
        service.stop()
        thread.join(5)
