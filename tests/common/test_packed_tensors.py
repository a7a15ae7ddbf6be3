"""Tensors packed in one frame (common/wire/frames.py's pack_tensors / unpack_tensors): a ps snapshot goes
as its own buffer, anything else as a zero-padded copy, and every hostile layout is refused."""

import msgpack
import numpy as np
import pytest
import zmq

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.wire.frames import (PACK_ALIGN, EncodedReply, PackedLayouts, SentTensor, decode_tensors,
                                        encode_tensor, pack, pack_tensors, recv_message, reply_frames, send_message,
                                        unpack, unpack_tensors)

pytestmark = pytest.mark.unit


def test_views_of_one_aligned_buffer_travel_as_that_buffer():
    buffer = np.zeros(256, np.uint8)
    weights, biases = buffer[:40].view(np.float32).reshape(2, 5), buffer[64:76].view(np.int32)
    weights[:] = 1.5
    layout, frame = pack_tensors([weights, biases])
    assert layout == [["float32", [2, 5], 0], ["int32", [3], 64]]
    assert frame.base is buffer and len(frame) == 128   # no copy: the snapshot's bytes themselves
    out = unpack_tensors(layout, frame)
    np.testing.assert_array_equal(out[0], weights)
    assert out[1].dtype == np.int32 and out[1].shape == (3,)


def test_other_arrays_are_copied_aligned_with_zero_padding():
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(3, dtype=np.int64), np.zeros((0, 4), np.float32)]
    layout, frame = pack_tensors(arrays)
    assert [entry[2] % PACK_ALIGN for entry in layout] == [0, 0, 0]
    assert not frame[24:64].any()   # the padding after the first tensor: zeros, never stale memory
    for got, want in zip(unpack_tensors(layout, frame), arrays):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype


@pytest.mark.parametrize("layout", [
    "not a list", [["float32", [2], 1]], [["float32", [1000], 0]], [["float32", [2, 3], 0], ["float32", [2], 8]],
    [["string", [1], 0]], [["float32", [2], -64]], [["float32", [2]]], [["nope", [2], 0]], [["float32", [-1], 0]],
    [["float32", [2], 0.0]]])
def test_a_hostile_layout_is_refused(layout):
    _, frame = pack_tensors([np.zeros((2, 3), np.float32)])
    with pytest.raises(InvalidArgumentError):
        unpack_tensors(layout, frame)


def test_the_packed_frame_must_be_one_uint8_vector():
    layout, frame = pack_tensors([np.zeros(4, np.float32)])
    for bad in (None, frame.view(np.float32), frame.reshape(2, -1)):
        with pytest.raises(InvalidArgumentError):
            unpack_tensors(layout, bad)


def test_a_layout_seen_before_gets_the_same_views_and_anything_else_is_checked_again():
    weights, biases = np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(3, dtype=np.int64)
    layout, frame = pack_tensors([weights, biases])
    layouts = PackedLayouts()
    for _ in range(2):   # checked, then remembered
        out = layouts.unpack(msgpack.unpackb(pack(layout)), frame.copy())   # as a header brings it
        np.testing.assert_array_equal(out[0], weights)
        assert out[1].dtype == np.int64 and out[1].shape == (3,)
    for hostile in ([["float32", [2, 3], 0.0], layout[1]],    # equal to the one checked, but not an int
                    [["float32", [2, 3], True], layout[1]],
                    [layout[0], ["int64", [3], 68]]):         # misaligned
        with pytest.raises(InvalidArgumentError):
            layouts.unpack(hostile, frame)
    assert len(layouts.unpack(layout, frame)) == 2
    with pytest.raises(InvalidArgumentError):   # the same layout over a shorter frame: its tensors do not fit
        layouts.unpack(layout, frame[:64])
    for bad in (frame.view(np.float32), frame.reshape(2, -1), bytes(frame)):
        with pytest.raises(InvalidArgumentError):
            layouts.unpack(layout, bad)


@pytest.mark.parametrize("count", [20_000, 100])   # 80 KB lent to the Frame without a copy; 400 bytes copied once
def test_a_sent_tensor_is_encoded_once_and_arrives_as_its_array_every_time(count):
    array = np.arange(count, dtype=np.float32)
    array.flags.writeable = False
    sent = SentTensor(array)
    spec, frame = encode_tensor(sent)
    assert spec == ["float32", [count]] and frame is sent.frame and isinstance(frame, zmq.Frame)
    context = zmq.Context()
    a, b = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    try:
        a.bind("inproc://sent-tensor")
        b.connect("inproc://sent-tensor")
        for rid in (1, 2):   # the same Frame, sent twice
            send_message(a, reply_frames(rid, result={"n": rid}, tensors=[sent]))
            _, header, frames, error = recv_message(b, False)
            assert error is None and header["id"] == rid
            np.testing.assert_array_equal(decode_tensors(header["tensors"], frames)[0], array)
    finally:
        a.close(0)
        b.close(0)
        context.term()


def test_a_sent_tensor_holds_numbers_only():
    with pytest.raises(InvalidArgumentError):
        SentTensor(np.array([b"text"], dtype=object))


def test_an_encoded_reply_reads_as_the_reply_it_stands_for_whatever_the_request_id():
    array = np.arange(20_000, dtype=np.float32)
    result = {"version": 3, "released": False, "names": ["w", "b"], "layout": [["float32", [20_000], 0]]}
    encoded = EncodedReply(result, [SentTensor(array)])
    for rid in (0, 7, 2**40):
        frames = reply_frames(rid, result=encoded)
        assert unpack(frames[0]) == unpack(reply_frames(rid, 0, None, result, [array])[0])
        assert frames[1] is encoded.frames[0]
    with pytest.raises(ValueError):   # a whole success answer: neither an error code nor other tensors with it
        reply_frames(1, 5, "no", encoded)
    with pytest.raises(ValueError):
        reply_frames(1, result=encoded, tensors=[array])
