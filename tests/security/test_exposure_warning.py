"""A service asked to listen beyond loopback without CURVE refuses (protected mode, as Redis's), unless
told `--insecure` (ZMQFLOW_INSECURE); then it says so, loudly, in its log.

The services here really bind loopback: a context whose sockets rewrite the
wildcard address lets the test see the service's own log line without ever
listening on the network.
"""

import logging
import re

import pytest
import zmq

from zmqflow.common.errors import PermissionDeniedError
from zmqflow.common.rpc import encryption as curve
from zmqflow.common.rpc.service import Service

pytestmark = pytest.mark.unit


class _LoopbackSocket(zmq.Socket):
    def bind(self, addr):
        return super().bind(addr.replace("tcp://0.0.0.0:", "tcp://127.0.0.1:").replace("tcp://*:", "tcp://127.0.0.1:"))


class _LoopbackContext(zmq.Context):
    _socket_class = _LoopbackSocket


@pytest.fixture
def context():
    ctx = _LoopbackContext()
    yield ctx
    curve.stop_authenticator(ctx)
    ctx.term()


def serve(bind, context, **kw):
    service = Service(bind, context=context, **kw)
    service.close()
    return service


@pytest.mark.parametrize("bind", ["tcp://0.0.0.0:*", "tcp://*:*", "tcp://10.1.2.3:*"])
def test_binding_beyond_loopback_without_curve_is_refused(bind, context, monkeypatch):
    monkeypatch.delenv(curve.INSECURE_ENV, raising=False)
    with pytest.raises(PermissionDeniedError, match=re.escape(f"refusing to listen on {bind} without CURVE "
                                                              "(protected mode): SECURITY: listening on")) as caught:
        serve(bind, context)
    assert str(caught.value).endswith(f"or pass --insecure (set {curve.INSECURE_ENV}=1) to accept anyone who "
                                      "reaches it")


@pytest.mark.parametrize("bind", ["tcp://0.0.0.0:*", "tcp://*:*"])
def test_binding_every_interface_without_curve_logs_a_security_warning(bind, context, caplog, monkeypatch):
    monkeypatch.setenv(curve.INSECURE_ENV, "1")
    with caplog.at_level(logging.WARNING):
        serve(bind, context)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(line.startswith(f"SECURITY: listening on {bind} without CURVE") and "--curve-dir" in line
               for line in lines), lines


def test_binding_loopback_does_not_warn(context, caplog):
    with caplog.at_level(logging.WARNING):
        serve("tcp://127.0.0.1:*", context)
    assert not [r for r in caplog.records if "SECURITY" in r.getMessage()]


def test_binding_every_interface_with_curve_does_not_warn(context, keys, caplog):
    with caplog.at_level(logging.WARNING):
        service = serve("tcp://0.0.0.0:*", context, curve_dir=keys["keys"])
    assert service.curve_dir == keys["keys"]
    assert not [r for r in caplog.records if "SECURITY" in r.getMessage()]


@pytest.mark.parametrize("bind,local", [
    ("tcp://127.0.0.1:5555", True), ("tcp://127.0.0.2:*", True), ("tcp://localhost:5555", True),
    ("tcp://[::1]:5555", True), ("ipc:///tmp/x", True), ("inproc://x", True),
    ("tcp://0.0.0.0:5555", False), ("tcp://*:5555", False), ("tcp://10.1.2.3:5555", False),
    ("tcp://eth0:5555", False), ("tcp://[::]:5555", False),
])
def test_is_loopback(bind, local):
    assert curve.is_loopback(bind) is local
