"""Hostile input against the protocol core (common/wire/protocol.py) and the broker's producer ops, over ZeroMQ.

Real services on ephemeral loopback ports (stopped by PID), probed as an attacker would: every declared op of
every table (iterated, so a new op is probed too) with wrong types, missing and unknown fields and absurd
values; raw frames that are not the wire format; admin ops without the credential; and a queue's producers
misbehaving (docs/queue-semantics.md §8). Each probe expects the exact error the protocol declares, and the
service still serving a legitimate client afterwards.
"""

import json
import os
import re
import math
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
import typing
from dataclasses import MISSING

import msgpack
import numpy as np
import pytest
import zmq

from zmqflow.common.errors import (AbortedError, FailedPreconditionError, InternalError, InvalidArgumentError,
                                   NotFoundError, OpError, OutOfRangeError, PermissionDeniedError, UnauthenticatedError,
                                   UnknownError)
from zmqflow.common.clients import queues
from zmqflow.common.rpc import admin_token
from zmqflow.common.clients.producers import Producer
from zmqflow.common.rpc.client import RpcClient
from zmqflow.common.wire import protocol
from zmqflow.common.wire.frames import pack, request_frames
from zmqflow.common.wire.limits import DEFAULT_LIMITS
from zmqflow.common.wire.protocol import ADMIN, TABLES, Name, requests_of
from zmqflow.common.checkpoints.checkpoint import save_params
from zmqflow.common.cluster.placement import place
from zmqflow.common.clients.ps import PsClient, PsShardClient
from zmqflow.models.registry import load_model, model_variables
from zmqflow.models.spec import MNIST_MLP

pytestmark = pytest.mark.service

SERVED_BY = {"queue-broker": "broker", "ps-shard": "ps", "serve": "serve", "aggregator": "aggregator",
             "in-graph replica": "replica", "ensemble serve": "ensemble"}
"""Which service answers each table's ops ('every service': each of them)."""
TIMEOUT = 5.0


@pytest.fixture(scope="module")
def services(module_processes):
    """One of each service, as a job starts them: the ps initialized, the model server following it, the
    aggregator with a member nobody listens on."""
    start = module_processes.service
    broker = start("zmqflow.services.broker", ["--client-timeout-secs", "3"])
    ps = start("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])
    shards = PsClient([ps.endpoint], place(model_variables(MNIST_MLP), 1))
    shards.initialize(load_model(MNIST_MLP).initial_values(1))
    shards.close()
    serve = start("zmqflow.services.serve", ["--ps", ps.endpoint, "--backend", "numpy"])
    aggregator = start("zmqflow.services.aggregator", ["--member", "tcp://127.0.0.1:7"])
    with PsShardClient(ps.endpoint) as client:    # an in-graph replica's share of the input, on the ps
        client.preload("probe", {"image": np.zeros((200, 784), np.float32), "label": np.zeros(200, np.int64)})
    replica = start("zmqflow.services.worker", ["--in-graph", "--ps", ps.endpoint, "--preloaded", "probe",
                                                "--backend", "numpy"])
    members = []     # an ensemble in one server: two checkpoints of the MLP
    for seed in (1, 2):
        members += ["--checkpoint", os.path.join(os.path.dirname(SCRATCH), f"member{seed}")]
        save_params(members[-1], 1, load_model(MNIST_MLP).initial_values(seed), {"model": MNIST_MLP})
    ensemble = start("zmqflow.services.serve", [*members, "--backend", "numpy"])
    yield {"broker": broker, "ps": ps, "serve": serve, "aggregator": aggregator, "replica": replica,
           "ensemble": ensemble}
    shutil.rmtree(os.path.dirname(SCRATCH), ignore_errors=True)   # what a probe's save wrote, the members


def answer(endpoint, op, args=None, tensors=(), **client):
    """The result of one request from a fresh client, or the OpError it was refused with."""
    with RpcClient(endpoint, **client) as rpc:
        try:
            return rpc.call(op, args, tensors, timeout=TIMEOUT)[0]
        except OpError as exc:
            return exc


def still_serving(process):
    """The service answers a legitimate client (a dead or wedged one raises)."""
    assert process.alive(), process.log()[-3000:]
    with RpcClient(process.endpoint) as rpc:
        assert rpc.call(protocol.Ops.Info(), timeout=TIMEOUT)[0]["pid"] == process.pid


def declared():
    """(table name, op name, declaration) of every declared op."""
    return [(table, op, request) for table, ops in TABLES.items() for op, request in requests_of(ops).items()]


def endpoints_for(table, services):
    return list(services.values()) if table == "every service" else [services[SERVED_BY[table]]]


def field_hint(request, name):
    return typing.get_type_hints(request, include_extras=True)[name]


def unwrap(hint):
    """(hint without `| None`, optional?)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        return next(h for h in args if h is not type(None)), True
    return hint, False


SCRATCH = f"{tempfile.gettempdir()}/zmqflow-probes-{os.getpid()}/x"
"""The string of a valid request: a name, and a directory where a ps's save may write."""
def deep_map(depth):
    value = None
    for _ in range(depth):
        value = {"a": value}
    return value


NAN, INF, DEEP = float("nan"), float("inf"), deep_map(1000)
WRONG = {  # values of the wrong kind for a field of each declared kind: the test's own reading of the table
    int: ["1", 1.5, True, NAN, [1], {"a": 1}, None, DEEP],
    float: ["1", True, NAN, INF, -INF, [1.0], None, DEEP],
    bool: [1, 0, "true", None, DEEP],
    str: [1, ["x"], {"a": "b"}, b"bytes", None, DEEP],
    Name: ["", 1, ["x"], b"bytes", None, DEEP],
    dict: [[], "x", 1, True, None],
    list: [{}, "x", 1, None, DEEP],
}
BAD_SECONDS = [0, -1, 1e9, NAN, INF, -INF, "5", True, DEEP, protocol.MAX_LEASE_SECONDS + 1, None]


def wrong_values(hint):
    """Values every check of `hint` must refuse."""
    hint, optional = unwrap(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        base, check = args
        if check is protocol.lease_seconds:
            values = BAD_SECONDS
        elif check.__doc__.startswith(">= "):
            low = int(check.__doc__[3:])
            values = WRONG[base] + [low - 1, -(2 ** 63)]
        else:  # one_of
            values = WRONG[base] + ["not-one-of-the-choices"]
    elif origin is list:
        values = WRONG[list] + [[w] for w in WRONG[args[0]][:3]]
    elif origin is dict:
        values = WRONG[dict] + [{"a": 1}, {1: "a"}]
    else:
        values = WRONG[hint]
    return [v for v in values if not (optional and v is None)]


def valid_base(request):
    """Args the declaration accepts: its required fields with a value of their kind, nothing else."""
    candidates = [10 ** 9, 1.0, SCRATCH, {}, ["x"], [1], False]   # 10**9: no queue, lease, ... has that id
    return {name: next(v for v in candidates if _accepts(check, v))
            for name, default, check in request._FIELDS if default is MISSING}


def _accepts(check, value):
    try:
        check(value)
        return True
    except InvalidArgumentError:
        return False


def refused(result, error, message):
    """Whether `result` is the OpError `error` whose message starts with `message`."""
    return isinstance(result, error) and str(result).startswith(message)


# ---------------------------------------------------------------- every declared op, every field


@pytest.mark.parametrize("table,op,request_", declared(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_op_refuses_ill_typed_missing_and_unknown_fields_naming_them(services, table, op, request_):
    for process in endpoints_for(table, services):
        endpoint, base = process.endpoint, valid_base(request_)
        for name, default, _ in request_._FIELDS:
            for value in wrong_values(field_hint(request_, name)):
                result = answer(endpoint, op, {**base, name: value})
                assert refused(result, InvalidArgumentError, f"{op}'s {name} must be "), (name, value, result)
            if default is MISSING:
                result = answer(endpoint, op, {k: v for k, v in base.items() if k != name})
                assert refused(result, InvalidArgumentError, f"{op} needs {name}: "), result
        for extra in ({"evil": 1}, {1: 2}, {"": None}):
            result = answer(endpoint, op, {**base, **extra})
            assert refused(result, InvalidArgumentError, f"{op} takes no {next(iter(extra))!r}"), result
        assert refused(answer(endpoint, op, [1, 2]), InvalidArgumentError, "request args must be a map")
        still_serving(process)


ABSURD = {  # values of the right kind that no sane client sends
    int: [-1, -(2 ** 63), 2 ** 63 - 1, 2 ** 64 - 1],
    float: [1e308, -1e308, 5e-324],
    str: ["x" * 200_000, "\x00\n\x1b[2J", "../../../../etc/passwd"],
    dict: [deep_map(1000), {"k" * 1000: "v" * 1000}, {"reading": 5, "instances": "many"}],
    list: [["x"] * 50_000],
}


def absurd_values(hint):
    hint, _ = unwrap(hint)
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return [1e-300] if typing.get_args(hint)[1] is protocol.lease_seconds else []
    kind = {Name: str, list: list, dict: dict}.get(origin or hint, origin or hint)
    return ABSURD.get(kind, [])


@pytest.mark.parametrize("table,op,request_", [d for d in declared() if d[2].ROLE != ADMIN],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_absurd_values_of_the_right_kind_are_answered_cleanly_and_the_service_keeps_serving(services, table, op,
                                                                                            request_):
    """Negative and 64-bit ints, 200 KB strings, maps 1000 deep: an answer or a declared error, never an internal
    one (a handler that did not expect it), a crash or a hang. (Admin ops are left out: one of them valid is a
    shutdown; their refusal is the role test's.)"""
    for process in endpoints_for(table, services):
        base = valid_base(request_)
        for name, _, _ in request_._FIELDS:
            for value in absurd_values(field_hint(request_, name)):
                result = answer(process.endpoint, op, {**base, name: value})
                assert not isinstance(result, (InternalError, UnknownError)), (name, str(value)[:60], result)
        still_serving(process)


@pytest.mark.parametrize("table,op,request_", declared(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_10_mb_string_is_refused_at_the_header_limit(services, table, op, request_):
    process = endpoints_for(table, services)[0]
    name = next((n for n, _, check in request_._FIELDS if "string" in check.words), "padding")
    result = answer(process.endpoint, op, {**valid_base(request_), name: "x" * 10_000_000})
    assert isinstance(result, InvalidArgumentError) and re.fullmatch(
        rf"header of \d{{8}} bytes exceeds the limit of {DEFAULT_LIMITS.max_header_bytes}", str(result)), result
    still_serving(process)


# ---------------------------------------------------------------- raw frames that are not the protocol


def raw_exchange(endpoint, frames, timeout=TIMEOUT):
    """Send `frames` from a bare DEALER; the reply header (a dict), or None when none came in `timeout` s."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(endpoint)
        sock.send_multipart(frames)
        if not sock.poll(int(timeout * 1000)):
            return None
        return msgpack.unpackb(sock.recv_multipart()[0], raw=False)
    finally:
        sock.close()


def header(op="ping", args=None, tensors=[], rid=7, **extra):  # noqa: B006 (never changed)
    return pack({"v": 1, "op": op, "id": rid, "deadline_ms": 2000, "args": args or {}, "tensors": tensors,
                 **extra})


def test_frames_that_are_not_the_wire_format_are_refused_and_the_broker_serves_on(services):
    broker = services["broker"]
    queue = queues.FIFOQueue(10, ["float32"], shapes=[[4]], shared_name="raw", broker=broker.endpoint)
    enqueue = {"queue": queue.handle}
    token = admin_token.for_client(broker.endpoint, admin_token.JOB_TOKEN)   # a member's: its frames are judged

    def member(*args):
        return header(*args, token=token)
    cases = [  # (frames, id the reply names, its message's start)
        ([b"\xff\x00garbage"], 0, "header is not valid msgpack"),
        ([b""], 0, "header is not valid msgpack"),
        ([b"\x81\xa1a" * 5000 + b"\xc0"], 0, "header is not valid msgpack"),       # a map 5000 deep
        ([pack([1, 2, 3])], 0, "header must be a msgpack map"),
        ([pack({"v": 99, "op": "ping", "id": 7})], 7, "unsupported wire version 99"),       # the id still found
        ([pack({"v": 1, "id": 7, "op": "ping", "pad": "x" * 2_000_000})], 7, "header of 20000"),
        ([header(rid="7")], 0, "request id must be an int"),
        ([header(op="")], 7, "request op must be a non-empty string"),
        ([header(op="x" * 300)], 7, "request op must be a non-empty string"),
        ([header(op="no_such_op")], 7, "unknown op 'no_such_op' for queue-broker"),
        ([header(deadline_ms=-5)], 7, "deadline_ms must be a non-negative int"),
        ([pack({"v": 1, "op": "ping", "id": 7, "args": "x"})], 7, "request args must be a map"),
        ([header(tensors=[["float32", [4]]])], 7, "header declares 1 tensors but 0 frames arrived"),
        ([header(), b"extra", b"frames"], 7, "header declares 0 tensors but 2 frames arrived"),
        ([header()] + [b"x"] * 1025, 7, "message has more than 1024 frames"),
        ([member("enqueue", enqueue, [["float32", [4]]]), b"\x00" * 15], 7,
         "tensor frame of 15 bytes does not match float32[4] (16 bytes)"),
        ([member("enqueue", enqueue, [["float32", [2 ** 62, 2 ** 62]]]), b"\x00" * 16], 7, "tensor frame of 16 bytes"),
        ([member("enqueue", enqueue, [["float32", [-4]]]), b"\x00" * 16], 7, "tensor dims must be non-negative ints"),
        ([member("enqueue", enqueue, [["float32", [1] * 33]]), b"\x00" * 4], 7, "tensor shape must be a list of at most"),
        ([member("enqueue", enqueue, [["evil", [4]]]), b"\x00" * 16], 7, "unsupported dtype 'evil'"),
        ([member("enqueue", enqueue, [[["float32"], [4]]]), b"\x00" * 16], 7, "unsupported dtype ['float32']"),
        ([member("enqueue", enqueue, [["float32"]]), b"\x00" * 16], 7, "tensor spec must be [dtype, shape]"),
        ([member("enqueue", enqueue, [deep_map(1000)]), b"\x00" * 16], 7, "tensor spec must be [dtype, shape]"),
        ([header(op=deep_map(1000))], 7, "request op must be a non-empty string"),
        ([member("enqueue", enqueue, "float32"), b"\x00" * 16], 7, "header field 'tensors' must be a list"),
        ([member("enqueue", enqueue, [["string", [2]]]), np.array([9, 1], "<u8").tobytes() + b"ab"], 7,
         "string tensor offsets do not match the frame"),
        ([member("enqueue", enqueue, [["string", [4]]]), b"\x01"], 7, "string tensor frame of 1 bytes is too short"),
    ]
    for frames, rid, message in cases:
        reply = raw_exchange(broker.endpoint, frames)
        assert reply is not None, f"no answer to {message}"
        assert (reply["code"], reply["id"]) == (InvalidArgumentError.code, rid), (message, reply)
        assert reply["error"].startswith(message), (message, reply["error"])
    assert queue.size() == 0                                     # nothing ill-formed got in
    queue.enqueue(np.arange(4, dtype=np.float32))                # a legitimate client is served
    np.testing.assert_array_equal(queue.dequeue(timeout=TIMEOUT), np.arange(4, dtype=np.float32))
    still_serving(broker)


# ---------------------------------------------------------------- roles


ADMIN_REQUESTS = [(table, op, request) for table, op, request in declared() if request.ROLE == ADMIN]


@pytest.mark.parametrize("table,op,request_", ADMIN_REQUESTS, ids=lambda v: v if isinstance(v, str) else "")
def test_an_admin_op_without_the_token_is_refused_before_its_args_are_read(services, table, op, request_):
    """No token UNAUTHENTICATED, a wrong or ill-typed one PERMISSION_DENIED, whatever the args (they are not
    looked at: a refused caller learns nothing of them), and the op does nothing: the service still serves."""
    process = endpoints_for(table, services)[0]
    for args in (valid_base(request_), {"evil": [1, 2]}):
        assert refused(answer(process.endpoint, op, args, admin_token=None), UnauthenticatedError,
                       f"{op} on the "), op
        assert refused(answer(process.endpoint, op, args, admin_token="not-the-token"), PermissionDeniedError,
                       f"{op} on the "), op
        for token in ("", 7, ["a"], {"t": 1}, None):
            reply = raw_exchange(process.endpoint, [header(op, args, token=token)])
            expected = UnauthenticatedError if token in ("", None) else PermissionDeniedError
            assert (reply["code"], reply["id"]) == (expected.code, 7), (op, token, reply)
    still_serving(process)


# ---------------------------------------------------------------- producer ops (docs/queue-semantics.md §8)


@pytest.fixture
def fifo(broker):
    """A fresh queue on the module's broker (its --client-timeout-secs 3), and the endpoint."""
    name = f"q{time.monotonic_ns()}"
    return queues.FIFOQueue(100, ["int64"], shapes=[[]], shared_name=name, broker=broker), broker


def producer_args(queue, name="p", lease=5.0, **more):
    return {"queue": queue.handle, "name": name, "lease": lease, **more}


def test_producer_ops_on_a_queue_or_source_that_does_not_exist_are_not_found(fifo):
    queue, broker = fifo
    for op in ("register_producer", "beat", "producer_done", "producers"):
        args = {"queue": 10 ** 9} if op == "producers" else {"queue": 10 ** 9, "name": "p", "lease": 5.0}
        assert refused(answer(broker, op, args), NotFoundError, "queue 1000000000 not found"), op
    assert refused(answer(broker, "producer_failed", {"queue": -1, "name": "p", "lease": 5.0, "code": 10, "error": "x"}),
                   NotFoundError, "queue -1 not found")
    assert refused(answer(broker, "register_producer", producer_args(queue, source=10 ** 9)), NotFoundError,
                   "queue 1000000000 not found")
    assert refused(answer(broker, "beat", producer_args(queue)), NotFoundError, "no producer ever registered")


def test_a_duplicate_name_an_unknown_producer_and_a_name_too_long_are_refused(fifo):
    queue, broker = fifo
    with RpcClient(broker) as rpc:
        rpc.call("register_producer", producer_args(queue), timeout=TIMEOUT)
        assert refused(answer(broker, "register_producer", producer_args(queue)), InvalidArgumentError,
                       "producer 'p' is already registered")
        for op in ("beat", "producer_done"):
            assert refused(answer(broker, op, producer_args(queue, "stranger")), FailedPreconditionError,
                           "stranger is not a producer of queue"), op
        assert refused(answer(broker, "register_producer", producer_args(queue, "n" * 257)), InvalidArgumentError,
                       "register_producer's name is longer than 256 characters")
        assert rpc.call("producers", {"queue": queue.handle}, timeout=TIMEOUT)[0]["closed"] is None
        rpc.call("producer_done", producer_args(queue), timeout=TIMEOUT)   # the refusals changed nothing
    assert queue.is_closed()


def test_producer_done_twice_closes_once_and_consumers_get_the_end(fifo):
    queue, broker = fifo
    with RpcClient(broker) as rpc:
        rpc.call("register_producer", producer_args(queue), timeout=TIMEOUT)
        queue.enqueue(np.int64(5))
        first = rpc.call("producer_done", producer_args(queue), timeout=TIMEOUT)[0]
        again = rpc.call("producer_done", producer_args(queue, exhausted=False), timeout=TIMEOUT)[0]
    assert first["closed"] == again["closed"] == "ok" and again["closed_by"] == "p"
    assert queue.dequeue(timeout=TIMEOUT) == 5
    with pytest.raises(OutOfRangeError):
        queue.dequeue(timeout=TIMEOUT)


@pytest.mark.parametrize("code", [0, 17, -1, 2 ** 63 - 1, OutOfRangeError.code])
def test_producer_failed_refuses_a_code_that_is_no_failure(fifo, code):
    """OK is no failure, and OUT_OF_RANGE is the end of input: a queue failed with it would end its consumers'
    epoch quietly short, what §8 says a failed queue never does."""
    queue, broker = fifo
    with RpcClient(broker) as rpc:
        rpc.call("register_producer", producer_args(queue), timeout=TIMEOUT)
        result = answer(broker, "producer_failed", producer_args(queue, code=code, error="boom"))
        assert refused(result, InvalidArgumentError, "producer_failed's error 'code' must be"), result
        assert rpc.call("producers", {"queue": queue.handle}, timeout=TIMEOUT)[0]["closed"] is None


def test_a_hostile_error_payload_reaches_consumers_as_text_and_fails_the_queue_once(fifo):
    queue, broker = fifo
    hostile = "\x1b[2J\x00\n" + "é" * 100_000 + "%s{}"
    with RpcClient(broker) as rpc:
        rpc.call("register_producer", producer_args(queue), timeout=TIMEOUT)
        state = rpc.call("producer_failed", producer_args(queue, code=AbortedError.code, error=hostile),
                         timeout=TIMEOUT)[0]
        assert state["closed"] == "failed" and state["error"] == hostile
        again = rpc.call("producer_failed", producer_args(queue, code=13, error="second"), timeout=TIMEOUT)[0]
        assert again["error"] == hostile and again["code"] == AbortedError.code   # the first failure stays
    with pytest.raises(AbortedError) as caught:
        queue.dequeue(timeout=TIMEOUT)
    assert str(caught.value) == hostile


PRODUCER = """
import sys, time
from zmqflow.common.clients import queues
from zmqflow.common.clients.producers import Producer
queue = queues.attach(sys.argv[2], broker=sys.argv[1])
producer = Producer(queue, lease=float(sys.argv[3]), name="doomed")
producer.beat({{"reading": {reading}, "instances": 3, "files_done": 1}})
print("registered", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("reading", ['["part-7.csv"]', "5"], ids=["files", "hostile-reading"])
def test_a_producer_killed_mid_work_fails_the_queue_for_its_consumers_within_its_lease(fifo, reading):
    """SIGKILL: the broker sees the connection drop and fails the queue with Aborted naming the producer and
    its file, well within the lease; a hostile `reading` in its last beat is refused or survived, never the
    broker's end (it once crashed the broker's loop when the producer vanished)."""
    queue, broker = fifo
    job = {admin_token.JOB_TOKEN.env: admin_token.for_client(broker, admin_token.JOB_TOKEN)}   # a job's member
    child = subprocess.Popen([sys.executable, "-c", PRODUCER.format(reading=reading), broker, queue.name, "30"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **job})
    try:
        line = child.stdout.readline()
        if reading == "5":   # refused at the door: the beat's progress is no producer's report
            assert line == "" and child.wait(TIMEOUT) != 0
            assert "InvalidArgumentError: beat's progress" in child.stderr.read()
            return
        assert line == "registered\n"
        started = time.monotonic()
        child.send_signal(signal.SIGKILL)
        with pytest.raises(AbortedError) as caught:
            queue.dequeue(timeout=TIMEOUT)
        assert time.monotonic() - started < 3.0               # the lease is 30 s: the drop was seen, not waited out
        assert "doomed stopped beating" in str(caught.value) and "its connection dropped" in str(caught.value)
        assert "while reading part-7.csv" in str(caught.value)
    finally:
        child.kill()
        child.wait(TIMEOUT)
    with RpcClient(broker) as rpc:
        assert rpc.call("info", timeout=TIMEOUT)[0]["service"] == "queue-broker"


@pytest.mark.parametrize("progress", [{"reading": 5}, {"reading": [1, 2]}, {"instances": "many"},
                                      {"files_done": [1]}, {"reading": "a.csv"}])
def test_a_beat_whose_progress_is_no_report_is_refused_naming_it(fifo, progress):
    queue, broker = fifo
    with RpcClient(broker) as rpc:
        rpc.call("register_producer", producer_args(queue, lease=1.0), timeout=TIMEOUT)
        for op in ("beat", "producer_done"):
            result = answer(broker, op, producer_args(queue, lease=1.0, progress=progress))
            assert refused(result, InvalidArgumentError, f"{op}'s progress must be"), result
    # the client's connection is gone: the producer vanished, and its last report was a sane one
    with pytest.raises(AbortedError, match="p stopped beating .* between files; it had pushed 0 instances"):
        queue.dequeue(timeout=TIMEOUT)


def test_a_producer_that_names_its_own_queue_as_source_vanishes_without_harm(fifo):
    queue, broker = fifo
    with RpcClient(broker) as rpc:
        rpc.call("register_producer", producer_args(queue, lease=1.0, source=queue.handle), timeout=TIMEOUT)
    with pytest.raises(AbortedError, match="p stopped beating"):
        queue.dequeue(timeout=TIMEOUT)
    with RpcClient(broker) as rpc:
        assert rpc.call("producers", {"queue": queue.handle}, timeout=TIMEOUT)[0]["closed"] == "failed"


def test_a_silent_producer_fails_the_queue_after_its_lease_and_never_hangs_its_consumers(fifo):
    queue, broker = fifo
    producer = Producer(queue, lease=0.5, name="sleepy")
    try:
        started = time.monotonic()
        with pytest.raises(AbortedError, match=r"sleepy stopped beating for .* \(silent past its lease; lease 0.5 s\)"):
            queue.dequeue(timeout=TIMEOUT)
        assert time.monotonic() - started < 2.5
    finally:
        producer.close()
