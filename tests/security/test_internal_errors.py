"""An unexpected exception in a handler is answered INTERNAL with an id only: its class, message and
traceback go to the service's log under that id, never over ZeroMQ, and the service keeps serving."""

import logging
import re
import threading
import traceback

import pytest
import zmq

from zmqflow.common.errors import INTERNAL, InternalError, InvalidArgumentError
from zmqflow.common.rpc.client import RpcClient
from zmqflow.common.rpc.service import Service
from zmqflow.common.wire import frames as wire

pytestmark = pytest.mark.service

SECRET = "/srv/zmqflow/keys/server.key_secret"   # what a handler's exception may hold: a path, a value
TOKEN = "admin-token-that-must-not-be-logged"
ANSWER = re.compile(r"internal error \(id ([0-9a-f]{12}); the buggy's log has the details\)")


class BuggyService(Service):
    """`boom` fails as a bug would (a KeyError holding a secret path); `refuse` raises an OpError on purpose."""

    name = "buggy"

    def __init__(self):
        super().__init__("tcp://127.0.0.1:*")
        self.handlers.update(boom=self._boom, refuse=self._refuse_on_purpose, echo=lambda call: {"args": call.args})

    def _boom(self, call):
        return {"key": {}[SECRET]}

    def _refuse_on_purpose(self, call):
        raise InvalidArgumentError(f"refused on purpose: {SECRET}")


@pytest.fixture
def buggy():
    service = BuggyService()
    thread = threading.Thread(target=service.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    yield service
    service.stop()
    thread.join(5)


def logged(caplog, error_id):
    """The service log's record of `error_id`, with its traceback as text."""
    [record] = [r for r in caplog.records if r.name == "zmqflow.common.rpc.service" and error_id in r.getMessage()]
    return record, "".join(traceback.format_exception(*record.exc_info))


def test_a_handler_bug_is_answered_by_id_its_detail_logged_under_it_and_the_service_serves_on(buggy, caplog):
    caplog.set_level(logging.ERROR, logger="zmqflow.common.rpc.service")
    with RpcClient(buggy.endpoint) as client:
        with pytest.raises(InternalError) as first:
            client.call("boom", timeout=5)
        message = str(first.value)
        assert ANSWER.fullmatch(message), message
        assert SECRET not in message and "KeyError" not in message and "Traceback" not in message
        error_id = ANSWER.fullmatch(message).group(1)
        record, detail = logged(caplog, error_id)
        assert f"internal error {error_id} handling" in record.getMessage()
        assert "KeyError" in detail and SECRET in detail and "in _boom" in detail   # class, message, traceback
        with pytest.raises(InternalError) as second:
            client.call("boom", timeout=5)
        assert ANSWER.fullmatch(str(second.value)).group(1) != error_id   # one id per failure
        with pytest.raises(InvalidArgumentError, match=f"refused on purpose: {SECRET}"):   # OpErrors unchanged
            client.call("refuse", timeout=5)
        assert client.call("echo", {"n": 1}, timeout=5)[0] == {"args": {"n": 1}}
    assert buggy.stats["errors"] == 3


def test_the_logged_request_never_holds_its_admin_token(buggy, caplog):
    caplog.set_level(logging.ERROR, logger="zmqflow.common.rpc.service")
    socket = zmq.Context.instance().socket(zmq.DEALER)   # a raw peer: the token rides in the header
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, 5000)
    try:
        socket.connect(buggy.endpoint)
        # a short header (reprlib, which bounds the logged request, would show its every field) with the token
        socket.send_multipart([wire.pack({"v": wire.VERSION, "op": "boom", "id": 7, "token": TOKEN})])
        reply = wire.unpack(socket.recv_multipart()[0])
    finally:
        socket.close()
    assert reply["id"] == 7 and reply["code"] == INTERNAL and ANSWER.fullmatch(reply["error"]), reply
    record, detail = logged(caplog, ANSWER.fullmatch(reply["error"]).group(1))
    assert TOKEN not in record.getMessage() + detail and "'token': '<redacted>'" in record.getMessage()
