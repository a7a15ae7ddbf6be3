"""tests/support itself: the bounded wait, free ports, processes stopped whatever happens, one tier per test."""

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.support import Processes, free_port, free_port_offset, wait_for

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_wait_for_returns_the_first_truthy_value():
    answers = iter([0, [], "ready"])
    assert wait_for(lambda: next(answers), 5, "the third answer", interval=0) == "ready"


def test_wait_for_names_what_it_waited_for_and_the_last_value():
    with pytest.raises(AssertionError, match=r"timed out after 0.1 s waiting for the queue to fill \(last: 0\)"):
        wait_for(lambda: 0, 0.1, "the queue to fill")


def test_wait_for_without_a_name_quotes_the_predicate():
    with pytest.raises(AssertionError, match=r"waiting for .*lambda: False"):
        wait_for(lambda: False, 0.05)


def test_wait_for_retries_only_the_exceptions_it_is_told_to():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("not yet")
        return len(calls)
    assert wait_for(flaky, 5, "a connection", interval=0, retry_on=ConnectionError) == 3
    with pytest.raises(ZeroDivisionError):
        wait_for(lambda: 1 / 0, 5, "a bug", retry_on=ConnectionError)


def test_free_port_and_offset_can_be_bound():
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
    ports = [5555, 5600, 5601]
    offset = free_port_offset(ports)
    assert offset % 100 == 0
    sockets = [socket.socket() for _ in ports]
    try:
        for s, port in zip(sockets, ports):
            s.bind(("127.0.0.1", port + offset))
    finally:
        for s in sockets:
            s.close()


@pytest.mark.service
def test_processes_stops_what_it_started_even_a_paused_one(tmp_path):
    registry = Processes(str(tmp_path))
    broker = registry.service("zmqflow.services.broker")
    helper = registry.process("zmqflow.services.broker", ["--help"])  # one that exits by itself
    broker.proc.send_signal(signal.SIGSTOP)  # a paused service sits out SIGTERM unless woken
    registry.stop_all()
    assert not broker.alive() and not helper.alive() and registry.running() == []
    assert broker.proc.returncode == 0, broker.log()  # woken, then stopped cleanly by SIGTERM


def run_pytest(tmp_path, source, *args):
    """Run pytest on one test file with tests/conftest.py's hooks and pyproject.toml's markers."""
    (tmp_path / "test_tiers_sample.py").write_text(textwrap.dedent(source))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "-c", os.path.join(ROOT, "pyproject.toml"), "--rootdir", str(tmp_path),
                           str(tmp_path / "test_tiers_sample.py"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_test_without_a_tier_fails_the_collection(tmp_path):
    result = run_pytest(tmp_path, """
        def test_forgotten():
            pass
    """)
    assert result.returncode == 4, result.stdout + result.stderr
    assert "test_tiers_sample.py::test_forgotten: no tier marker" in result.stderr


def test_a_tests_own_tier_overrides_its_modules_for_selection(tmp_path):
    source = """
        import pytest

        pytestmark = pytest.mark.unit

        def test_plain():
            pass

        @pytest.mark.faults
        def test_kill():
            pass
    """
    for expression, selected in (("unit", "test_plain"), ("faults", "test_kill")):
        result = run_pytest(tmp_path, source, "-m", expression, "--collect-only")
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"::{selected}" in result.stdout and "1/2 tests collected" in result.stdout, result.stdout
