"""The RPC call core (common/rpc/calls.py) on its own, and one body of client tests run against its three drivers:
blocking (RpcClient), asyncio (AsyncRpcClient) and a service's own loop (LoopClient, here inside a relay service)."""

import asyncio
import threading

import numpy as np
import pytest
import zmq.asyncio

from zmqflow.common.wire import frames as wire
from zmqflow.common.errors import (DeadlineExceededError, InvalidArgumentError, ResourceExhaustedError,
                                   UnavailableError)
from zmqflow.common.wire.protocol import Ops
from zmqflow.common.rpc.asyncio_client import AsyncRpcClient
from zmqflow.common.rpc.calls import BACKOFF_MAX, BACKOFF_START, Calls, grace_for
from zmqflow.common.rpc.client import RpcClient
from zmqflow.common.rpc.service import PARKED, LoopClient, Service
from tests.common.test_rpc import ToyService
from tests.support import wait_for

pytestmark = pytest.mark.service


# ------------------------------------------------ the core, without sockets


class Directory:
    def endpoint(self, address):
        return "tcp://127.0.0.1:1"

    def refresh(self, address):
        pass


def reply(rid, code=0, result=None, error=None):
    return wire.unpack(wire.reply_frames(rid, code, error, result)[0])


def test_the_core_keeps_ids_deadlines_and_drops_late_replies():
    calls = Calls("tcp://svc:1", resolver=Directory())
    first, frames = calls.request(Ops.Ping(), None, (), 2.0, now=100.0)
    second, _ = calls.request("echo", {"x": 1}, (), None, now=100.0)
    header = wire.unpack(frames[0])
    assert (header["op"], header["id"], header["deadline_ms"]) == ("ping", first.id, 2000) and second.id == first.id + 1
    assert first.deadline == 102.0 + grace_for(2.0) and second.deadline is None
    assert calls.overdue(102.0 + grace_for(2.0)) == [first]
    cancel = wire.unpack(calls.give_up(first)[0])
    assert cancel["op"] == "cancel" and cancel["args"] == {"target": first.id}
    assert isinstance(first.error, UnavailableError) and "within its deadline and grace" in str(first.error)
    assert calls.received(reply(first.id), []) is None and calls.late_replies == 1   # given up: dropped
    assert calls.received(reply(second.id, result={"ok": 1}), []) is second and second.value == ({"ok": 1}, [])


def test_the_core_learns_lost_requests_and_the_limit_from_pings_and_backs_off():
    calls = Calls("tcp://svc:1", resolver=Directory())
    call, _ = calls.request("echo", {}, (), None, now=0.0)
    ping = wire.unpack(calls.ping()[0])
    assert ping["args"] == {"ids": [call.id]}
    assert calls.received(reply(ping["id"], result={"unknown": [call.id], "max_message_bytes": 100}), []) is None
    assert "lost request" in str(call.error) and calls.service_max_bytes == 100
    with pytest.raises(InvalidArgumentError, match="exceeds the limit of 100 bytes"):
        calls.request("echo", {"x": "y" * 200}, (), None, now=0.0)
    waits = []
    for _ in range(5):
        calls.lost(lambda c: UnavailableError("gone"), now=0.0)
        waits.append(calls.retry_at)
    assert waits == [BACKOFF_START, 0.5, 1.0, BACKOFF_MAX, BACKOFF_MAX]
    calls.announced()
    assert calls.retry_at == 0.0 and calls.backoff == BACKOFF_START


# ------------------------------------------------ one body, three drivers


class Relay(Service):
    """Forwards `relay` {op, args} and its tensors to `upstream` from its own loop (a LoopClient) and answers
    with what came back: the in-loop driver, reached by a test through a blocking client."""

    name = "relay"

    def __init__(self, upstream):
        super().__init__("tcp://127.0.0.1:*")
        self.link = LoopClient(self, upstream, "relay", self._answered, lambda: None)
        self.link.connect()
        self.waiting = {}   # upstream call id -> the parked relay call
        self.handlers["relay"] = self._relay

    def _relay(self, call):
        timeout = None if call.deadline is None else call.deadline - call.received
        sent = self.link.submit(call.args["op"], call.args["args"], call.tensors, timeout)
        self.waiting[sent.id], call.state = call, sent
        return self.park(call)

    def _answered(self, sent):
        call = self.waiting.pop(sent.id)
        if sent.error is not None:
            self.fail(call, sent.error)
            return
        header, frames = sent.value
        self.reply(call, header["result"], wire.decode_tensors(header["tensors"], frames, self.limits))

    def on_cancel(self, call, error):
        self.link.cancel(call.state)
        super().on_cancel(call, error)

    def close(self):
        self.link.close()
        super().close()


def start(service):
    thread = threading.Thread(target=service.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    return thread


class Blocking:
    def __init__(self, endpoint):
        self.client = RpcClient(endpoint)

    def submit(self, op, args=None, tensors=(), timeout=5.0):
        return self.client.submit(op, args, tensors, timeout)

    def cancel(self, handle):
        handle.cancel()

    def close(self):
        self.client.close()


class Async:
    """AsyncRpcClient on an event loop of its own thread; `submit` hands back a concurrent future."""

    def __init__(self, endpoint):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.context = zmq.asyncio.Context()
        self.client = self._run(self._make(endpoint)).result()

    async def _make(self, endpoint):
        return AsyncRpcClient(endpoint, self.context)

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def submit(self, op, args=None, tensors=(), timeout=5.0):
        return self._run(self.client.call(op, args, tensors, timeout))

    def cancel(self, handle):
        handle.cancel()

    def close(self):
        async def stop():
            self.client.close()
            await asyncio.sleep(0)   # the reader task ends on its cancel
        self._run(stop()).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
        self.context.term()


class InLoop(Blocking):
    def __init__(self, endpoint):
        self.relay = Relay(endpoint)
        self.thread = start(self.relay)
        super().__init__(self.relay.endpoint)

    def submit(self, op, args=None, tensors=(), timeout=5.0):
        return super().submit("relay", {"op": op, "args": args or {}}, tensors, timeout)

    def close(self):
        super().close()
        self.relay.stop()
        self.thread.join(5)


@pytest.fixture
def toy():
    service = ToyService()
    thread = start(service)
    yield service
    service.stop()
    thread.join(5)


@pytest.fixture(params=[Blocking, Async, InLoop], ids=["blocking", "asyncio", "in-loop"])
def driver(request, toy):
    made = request.param(toy.endpoint)
    yield made
    made.close()


def test_a_round_trip_carries_args_and_tensors(driver):
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([b"a", b"bc"], dtype=object),
              np.arange(100_000, dtype=np.int64)]
    result, out = driver.submit("echo", {"x": 1}, arrays).result()
    assert result == {"args": {"x": 1}}
    for a, b in zip(arrays, out, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_many_calls_in_flight_are_matched_by_id(driver):
    handles = [driver.submit("echo", {"i": i}) for i in range(50)]
    assert [h.result()[0]["args"]["i"] for h in reversed(handles)] == list(reversed(range(50)))


def test_the_services_error_and_its_retry_hint_reach_the_caller(driver):
    with pytest.raises(ResourceExhaustedError, match="toy is full") as caught:
        driver.submit("full", {}).result()
    assert caught.value.retry_after == 0.25


def test_the_service_enforces_the_deadline(driver, toy):
    with pytest.raises(DeadlineExceededError):
        driver.submit("wait", timeout=0.3).result()
    # in-loop, the relay's own deadline (the same 0.3 s, from its receipt) answers the caller first
    wait_for(lambda: toy.withdrawn, 2, "the service to withdraw the call")
    assert toy.withdrawn[-1][0] == "deadline"


def test_a_cancelled_call_is_withdrawn_at_the_service(driver, toy):
    handle = driver.submit("wait", timeout=10)
    wait_for(lambda: toy.waiting, 5, "the wait request to be parked")
    driver.cancel(handle)
    wait_for(lambda: toy.withdrawn, 5, "the request to be withdrawn")
    assert toy.withdrawn == [("cancel", toy.waiting[0].id)]


def test_a_parked_call_is_answered_later(driver, toy):
    handle = driver.submit("wait", timeout=10)
    wait_for(lambda: toy.waiting, 5, "the wait request to be parked")
    with RpcClient(toy.endpoint) as other:
        assert other.call("release", timeout=5)[0] == {"count": 1}
    assert handle.result()[0] == {"released": True}
