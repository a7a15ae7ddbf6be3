"""Issue: an oversized message was refused but kept alive by a reference cycle through the refusal's
exception (about one frame's size per message until a garbage collection). Real services get 50
frames far over their message limit from a raw socket: each is refused with INVALID_ARGUMENT and its
memory given back at once, so the process's RSS stays within one frame of what it was before and does
not grow from the first refusal to the fiftieth. (What stays is one frame's buffer, the receive buffer of
the largest message read, which the allocator keeps and the next one reuses.)"""

import zmq
import pytest

from zmqflow.common.wire import frames as wire
from zmqflow.common.errors import InvalidArgumentError

pytestmark = pytest.mark.faults

FRAME = 20 * 1024 * 1024     # each oversized message: one 20 MiB frame
LIMIT = 16 * 1024 * 1024     # the services' --max-message-bytes: over it, under the 2x socket cap


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.parametrize("module", ["zmqflow.services.broker", "zmqflow.services.ps"])
def test_fifty_oversized_frames_are_refused_and_freed(processes, module):
    args = ["--max-message-bytes", str(LIMIT)]
    if module == "zmqflow.services.ps":
        args += ["--model", '{"type": "logistic", "inputs": 4, "classes": 2}']
    service = processes.service(module, args)
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(service.endpoint)
    try:
        sock.send_multipart(wire.request_frames("ping", 1, {"ids": []}, (), 5000))
        assert sock.poll(5000) and wire.unpack(sock.recv_multipart()[0])["code"] == 0
        baseline = rss_bytes(service.pid)
        blob = b"\0" * FRAME
        first = None
        for i in range(50):
            sock.send_multipart([wire.pack({"v": wire.VERSION, "op": "ping", "id": i + 2, "args": {}, "tensors": []}),
                                 blob])
            assert sock.poll(10_000), f"no answer to oversized message {i}"
            reply = wire.unpack(sock.recv_multipart()[0])
            assert reply["code"] == InvalidArgumentError.code and "exceeds the limit" in reply["error"]
            first = first or rss_bytes(service.pid)
        after = rss_bytes(service.pid)
        assert after <= first + 2 * 2**20, f"RSS grew from {first / 2**20:.0f} to {after / 2**20:.0f} MiB"
        assert after <= baseline + FRAME + 4 * 2**20, f"RSS {baseline / 2**20:.0f} MiB before, " \
            f"{after / 2**20:.0f} MiB after 50 refused {FRAME // 2**20} MiB frames: more than the one frame kept"
        sock.send_multipart(wire.request_frames("ping", 99, {"ids": []}, (), 5000))   # still serving
        assert sock.poll(5000) and wire.unpack(sock.recv_multipart()[0])["code"] == 0
    finally:
        sock.close(0)
