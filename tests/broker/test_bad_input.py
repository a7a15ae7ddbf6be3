"""Hostile input: random bytes, truncated frames, wrong dtypes and shapes, huge sizes, unknown ops.

Every message gets an answer (INVALID_ARGUMENT or another error, never a dead
loop), and afterwards the broker still serves and no queue gained or lost an element.
"""

import uuid

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zmqflow.common.rpc import admin_token
from zmqflow.common.wire import frames as wire
from zmqflow.common.errors import OK
from zmqflow.common.clients.queues import FIFOQueue

pytestmark = pytest.mark.faults

OPS = ["enqueue", "enqueue_many", "dequeue", "dequeue_many", "dequeue_up_to", "close", "size", "is_closed",
       "open_queue", "reset", "list_queues", "ping", "cancel", "nope", "", "x" * 300]
DTYPES = ["float32", "int32", "int64", "string", "bool", "complex64", "bfloat16", 7, None]
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True),
                         st.text(max_size=20), st.binary(max_size=20))
values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)
shapes = st.one_of(st.lists(st.one_of(st.integers(-3, 10), st.just(2**40), st.none(), st.text(max_size=2)),
                            max_size=5), values)


@st.composite
def hostile_messages(draw, handle):
    kind = draw(st.sampled_from(["bytes", "header", "frames"]))
    if kind == "bytes":
        return draw(st.lists(st.binary(max_size=64), min_size=1, max_size=4))
    args = draw(st.dictionaries(st.sampled_from(["queue", "n", "declaration", "container", "target",
                                                 "cancel_pending_enqueues", "ids"]),
                                st.one_of(values, st.just(handle)), max_size=4))
    header = {"v": draw(st.sampled_from([1, 1, 1, 2, "1", None])), "op": draw(st.sampled_from(OPS)),
              "id": draw(st.one_of(st.integers(0, 2**31), st.text(max_size=3))),
              "deadline_ms": draw(st.one_of(st.none(), st.integers(-5, 50), st.text(max_size=2))),
              "args": args,
              "tensors": draw(st.lists(st.one_of(st.tuples(st.sampled_from(DTYPES), shapes).map(list), values),
                                       max_size=3))}
    for key in draw(st.lists(st.sampled_from(list(header)), max_size=2)):
        header.pop(key, None)
    frames = draw(st.lists(st.binary(max_size=256), max_size=4))
    if kind == "header":
        packed = msgpack.packb(header, use_bin_type=True)
        cut = draw(st.integers(0, len(packed)))
        return [packed[:cut] if draw(st.booleans()) else packed] + frames
    return [msgpack.packb(header, use_bin_type=True)] + frames


@pytest.fixture
def sentinel(broker):
    """A queue holding known elements that no hostile message may change."""
    # its own container: a hostile `reset` of some container must not reach it
    q = FIFOQueue(100, ["int32"], shapes=[[2]], shared_name="sentinel", container=f"sentinel-{uuid.uuid4().hex}",
                  broker=broker)
    q.enqueue_many([np.arange(20, dtype=np.int32).reshape(10, 2)])
    return q


@pytest.mark.slow
def test_hostile_messages_are_answered_and_change_nothing(broker, sentinel):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(broker)
    answered = []

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data):
        # avoid ops that legitimately change the sentinel: route everything at another handle
        msg = data.draw(hostile_messages(handle=sentinel.handle + 10_000))
        sock.send_multipart(msg)
        while sock.poll(3000):
            header = wire.unpack(sock.recv_multipart()[0])
            answered.append(header["code"])
            if not sock.poll(50):
                break
        else:
            raise AssertionError(f"no answer to {msg!r:.300}")

    one()
    sock.close()
    assert any(code != OK for code in answered)
    assert sentinel.size() == 10
    assert sentinel.dequeue_many(10, timeout=2).tolist() == np.arange(20).reshape(10, 2).tolist()


def test_sizes_larger_than_the_frames_are_refused(broker, sentinel):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(broker)
    token = admin_token.for_client(broker, admin_token.JOB_TOKEN)
    for spec, frame in ((["int32", [1]], b""), (["int32", [2**40, 2**40]], b"\0" * 8), (["int32", [1, 2]], b"\0" * 8 * 3),
                        (["string", [2]], b"\0" * 4), (["string", [1]], np.array([99], "<u8").tobytes() + b"ab")):
        header = {"v": 1, "op": "enqueue", "id": 1, "deadline_ms": None, "args": {"queue": sentinel.handle},
                  "tensors": [spec], "token": token}   # a member's: the frames themselves are judged
        sock.send_multipart([wire.pack(header), frame])
        assert sock.poll(3000)
        assert wire.unpack(sock.recv_multipart()[0])["code"] == 3
    sock.close()
    assert sentinel.size() == 10


def test_oversized_message_names_the_limit(processes):
    from zmqflow.common.errors import InvalidArgumentError
    small = processes.service("zmqflow.services.broker", ["--max-message-bytes", "100000"])
    q = FIFOQueue(10, "float32", shapes=[[50_000]], broker=small.endpoint)
    with pytest.raises(InvalidArgumentError, match="exceeds the limit of 100000 bytes"):
        q.enqueue(np.zeros(50_000, np.float32), timeout=2)
    assert q.size() == 0
