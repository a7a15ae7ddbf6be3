"""V6 (docs/cli.md) in every service command: a bad option, config or address exits 2 with one `Error:` line that
names it, never a traceback; a runtime failure exits 1 (the reader's and the worker's: tests/reader,
tests/deploy/test_shutdown.py, where a lost peer exits 3). Each service has a case here, so a service that goes
back to a traceback or to exit 1 for a user's mistake fails its own test."""

import json
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from zmqflow.cli.main import main
from zmqflow.common.bind import FORMS

BAD_OPTIONS = {
    "broker": (["--bind", ":5555"], "--bind", "0.0.0.0:5555 for every interface"),
    "ps": (["--bind", "host:port", "--model", "logistic"], "--bind", FORMS),
    "worker": (["--serve", "ckpt", "--bind", "ipc://"], "--bind", "ipc:// needs a path"),
    "reader": (["--broker", "tcp://127.0.0.1:1", "--preset", "mnist-csv", "--metrics-bind", "nope"],
               "--metrics-bind", FORMS),
    "serve": (["--checkpoint", "ckpt", "--bind", "70000"], "--bind", FORMS),
    "aggregator": (["--member", "tcp://127.0.0.1:1", "--bind", "tcp://5555"], "--bind", "tcp://HOST:PORT"),
    "gateway": (["--serve", "tcp://127.0.0.1:1", "--grpc-bind", "http"], "--grpc-bind", FORMS),
}
"""service -> (arguments with one bad value, the option the error must name, what it must say)."""


def error_lines(output):
    return [line for line in output.splitlines() if line.startswith("Error:")]


@pytest.mark.unit
@pytest.mark.parametrize("service", sorted(BAD_OPTIONS))
def test_a_bad_option_exits_2_naming_it(service):
    args, option, said = BAD_OPTIONS[service]
    result = CliRunner().invoke(main, [service, *args])
    assert result.exit_code == 2, result.output
    [line] = error_lines(result.output)
    assert option in line and said in line, line


@pytest.mark.unit
@pytest.mark.parametrize("service", ["ps", "worker", "reader"])
def test_a_bad_task_config_exits_2_naming_it(service, tmp_path):
    config = tmp_path / "task.json"
    config.write_text(json.dumps({"no-such-option": 1}))
    result = CliRunner().invoke(main, [service, "--config", str(config)])
    assert result.exit_code == 2, result.output
    [line] = error_lines(result.output)
    assert "--config" in line and "'no-such-option' is not an option" in line, line


@pytest.mark.unit
def test_bad_input_found_once_it_runs_exits_2():
    """A model that is not there (ps), a checkpoint that is not there (serve): bad input, exit 2, one line."""
    for args, said in ((["ps", "--model", "no-such-model"], "model 'no-such-model' is not known"),
                       (["serve", "--checkpoint", "/nonexistent"], "NotFoundError: no committed checkpoint")):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        [line] = error_lines(result.output)
        assert said in line, line


LISTENERS = {
    "broker": ["--bind", "{port}"],
    "ps": ["--model", "logistic", "--bind", "127.0.0.1:{port}"],
    "aggregator": ["--member", "tcp://127.0.0.1:1", "--bind", "tcp://127.0.0.1:{port}"],
    "gateway": ["--serve", "tcp://127.0.0.1:1", "--bind", "{port}"],
    "reader": ["--broker", "tcp://127.0.0.1:1", "--preset", "mnist-csv", "--metrics-bind", "{port}"],
}
"""service -> arguments that make it listen on {port} (a port taken by the test)."""


@pytest.mark.service
@pytest.mark.parametrize("service", sorted(LISTENERS))
def test_an_address_in_use_exits_2_naming_the_option(service):
    """The ZeroMQ services, the gateway's HTTP side and a task's metrics: `cannot listen` is a bad --*-bind."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [arg.format(port=port) for arg in LISTENERS[service]]
        done = subprocess.run([sys.executable, "-m", f"zmqflow.services.{service}", *args], capture_output=True,
                              text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    [line] = error_lines(done.stderr)
    option = "--metrics-bind" if service == "reader" else "--bind"
    url = "tcp://" if service in ("broker", "ps", "aggregator") else ""   # a ZeroMQ service names its endpoint
    assert option in line and f"cannot listen on {url}127.0.0.1:{port}: Address already in use" in line, line
