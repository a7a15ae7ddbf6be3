"""The process supervisor with real children: stops reach grandchildren, stubborn children are killed,
exits are reported with their codes, and nothing outlives the `with` block."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.support import wait_for
from zmqflow.common.processes.supervisor import Supervisor

pytestmark = pytest.mark.service

SLEEPER = "import time; time.sleep(60)"


def python(code):
    return [sys.executable, "-c", textwrap.dedent(code)]


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:   # a zombie nobody reaps yet is gone too
        return f.read().split(")")[-1].split()[0] == "Z"


def test_a_stop_reaches_the_grandchildren(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    parent = f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", {SLEEPER!r}])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(60)
        """
    with Supervisor(stop_timeout=5) as supervisor:
        child = supervisor.start("parent", python(parent))
        grandchild = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 10, "the grandchild's pid"))
    assert child.returncode == -signal.SIGTERM
    wait_for(lambda: gone(grandchild), 5, "the grandchild to be stopped with its parent")


def test_a_child_that_ignores_sigterm_is_killed_after_the_bound():
    stubborn = """
        import signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(60)
        """
    supervisor = Supervisor(stop_timeout=0.5)
    child = supervisor.start("stubborn", python(stubborn), stdout=subprocess.PIPE)
    assert child.proc.stdout.readline() == b"ready\n"          # its handler is in place
    heard = []
    codes = supervisor.stop_all(report=lambda c, code, killed: heard.append((c.name, code, killed)))
    assert heard == [("stubborn", -signal.SIGKILL, True)] and codes[child] == -signal.SIGKILL


def test_stop_all_goes_in_reverse_start_order():
    supervisor = Supervisor(stop_timeout=5)
    for name in ("broker", "ps0", "worker0"):
        supervisor.start(name, python(SLEEPER))
    heard = []
    supervisor.stop_all(report=lambda child, code, killed: heard.append(child.name))
    assert heard == ["worker0", "ps0", "broker"]


def test_exits_are_reported_once_with_their_codes_and_the_first_failure_is_named():
    with Supervisor() as supervisor:
        ok = supervisor.start("ok", python("pass"))
        bad = supervisor.start("bad", python("import sys; sys.exit(3)"))
        sleeper = supervisor.start("sleeper", python(SLEEPER))
        seen = {}
        wait_for(lambda: seen.update({c.name: code for c, code in supervisor.exits()}) or len(seen) == 2, 10)
        assert seen == {"ok": 0, "bad": 3}
        assert supervisor.exits() == []                            # each exit is reported once
        assert supervisor.first_failure() == (bad, 3)
        assert supervisor.running() == [sleeper] and ok.returncode == 0


def test_nothing_outlives_the_with_block_when_it_raises():
    with pytest.raises(RuntimeError, match="the job failed"):
        with Supervisor(stop_timeout=5) as supervisor:
            children = [supervisor.start(f"task{i}", python(SLEEPER)) for i in range(3)]
            raise RuntimeError("the job failed")
    assert all(child.returncode == -signal.SIGTERM for child in children)


def test_a_restarted_task_is_a_new_child():
    """The same name twice (a ps restarted on its address): each run's exit is its own."""
    supervisor = Supervisor()
    first = supervisor.start("ps0", python("import sys; sys.exit(1)"))
    wait_for(lambda: supervisor.exits(), 10)
    second = supervisor.start("ps0", python("pass"))
    assert wait_for(lambda: supervisor.exits(), 10) == [(second, 0)]
    assert supervisor.codes == {first: 1, second: 0}


def test_a_program_that_does_not_exist_is_an_oserror():
    with pytest.raises(OSError):
        Supervisor().start("missing", ["/no/such/program"])


def test_a_child_left_running_is_stopped_when_its_owner_exits(tmp_path):
    """The owner forgets its child and exits (here: with an uncaught exception): the child goes too."""
    pid_file = tmp_path / "child.pid"
    owner = f"""
        import sys
        from zmqflow.common.processes.supervisor import Supervisor
        child = Supervisor().start("sleeper", [sys.executable, "-c", {SLEEPER!r}])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        raise SystemExit("the owner fails")
        """
    result = subprocess.run(python(owner), capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "the owner fails" in result.stderr
    assert gone(int(pid_file.read_text()))
