"""`zmqflow gateway`'s command line: documented options, one upstream required, and without the http extra
a clear message naming it (exit 2) instead of an ImportError."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.service

WITHOUT_STARLETTE = ("import sys; sys.modules['starlette'] = None; sys.argv[0] = 'zmqflow-gateway'; "
                     "from zmqflow.services.gateway.cli import main; main()")


def run(*args, code=None):
    argv = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "zmqflow", "gateway", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_help_names_the_upstreams_and_the_limits():
    done = run("--help")
    assert done.returncode == 0
    for option in ("--aggregator", "--serve", "--bind", "--max-body-bytes", "--header-timeout-secs", "X-Zmqflow-Deadline-Ms"):
        assert option in done.stdout


def test_one_upstream_is_required():
    done = run("--bind", "127.0.0.1:0")
    assert done.returncode == 2 and "give one of --aggregator ENDPOINT or --serve ENDPOINT" in done.stderr


def test_without_the_http_extra_it_says_which_to_install():
    done = run("--serve", "tcp://127.0.0.1:1", code=WITHOUT_STARLETTE)
    assert done.returncode == 2 and "pip install 'zmqflow[http]'" in done.stderr, done.stderr
