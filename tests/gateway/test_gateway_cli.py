"""`zmqflow gateway`'s command line: documented options, one upstream required, and without the http extra
(or the grpc extra, for --grpc-bind) a clear message naming it (exit 2) instead of an ImportError."""

import socket
import subprocess
import sys

import pytest

from tests.support import wait_for

pytestmark = pytest.mark.service

WITHOUT_STARLETTE = ("import sys; sys.modules['starlette'] = None; sys.argv[0] = 'zmqflow-gateway'; "
                     "from zmqflow.services.gateway.cli import main; main()")
WITHOUT_GRPC = WITHOUT_STARLETTE.replace("'starlette'", "'grpc'")


def run(*args, code=None):
    argv = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "zmqflow", "gateway", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_help_names_the_upstreams_and_the_limits():
    done = run("--help")
    assert done.returncode == 0
    for option in ("--aggregator", "--serve", "--bind", "--grpc-bind", "--max-body-bytes", "--header-timeout-secs",
                   "X-Zmqflow-Deadline-Ms"):
        assert option in done.stdout


def test_one_upstream_is_required():
    done = run("--bind", "127.0.0.1:0")
    assert done.returncode == 2 and "give one of --aggregator ENDPOINT or --serve ENDPOINT" in done.stderr


def test_without_the_http_extra_it_says_which_to_install():
    done = run("--serve", "tcp://127.0.0.1:1", code=WITHOUT_STARLETTE)
    assert done.returncode == 2 and "pip install 'zmqflow[http]'" in done.stderr, done.stderr


def test_without_the_grpc_extra_grpc_bind_says_which_to_install():
    done = run("--serve", "tcp://127.0.0.1:1", "--grpc-bind", "0", code=WITHOUT_GRPC)
    assert done.returncode == 2 and "--grpc-bind needs the grpc extra: pip install 'zmqflow[http,grpc]'" in done.stderr


def test_without_the_grpc_extra_the_gateway_serves_rest(processes, tmp_path):
    ready = tmp_path / "ready"
    processes.start("gateway", [sys.executable, "-c", WITHOUT_GRPC, "--serve", "tcp://127.0.0.1:1", "--bind",
                                "127.0.0.1:0", "--ready-file", str(ready)], log_path=str(tmp_path / "log"))
    wait_for(ready.exists, 30, "the gateway to serve without grpcio")
    assert ready.read_text().startswith("http://127.0.0.1:")


def test_a_grpc_address_in_use_is_a_usage_error():
    pytest.importorskip("grpc", reason="the grpc extra installs grpcio")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = run("--serve", "tcp://127.0.0.1:1", "--bind", "127.0.0.1:0", "--grpc-bind",
                   f"127.0.0.1:{taken.getsockname()[1]}")
    assert done.returncode == 2 and "--grpc-bind" in done.stderr and "cannot listen on 127.0.0.1:" in done.stderr
    done = run("--serve", "tcp://127.0.0.1:1", "--grpc-bind", "host:port")
    assert done.returncode == 2 and "Invalid value for '--grpc-bind'" in done.stderr and "expected [HOST:]PORT" \
        in done.stderr, done.stderr
