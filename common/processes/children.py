"""Child processes stopped by PID: the handle every launcher, test and benchmark holds.

A service started here binds an ephemeral loopback port (`tcp://127.0.0.1:*`)
and writes the endpoint it got to a ready file; `start_service` waits for that
file (bounded), so callers never guess ports or sleep.

Every child runs in its own process group, so a stop reaches what it
started in turn (a reader's reader processes, a job's tasks). A child that its
owner forgot is stopped when the owning interpreter exits, also after an
uncaught exception. Several children owned together: common/processes/supervisor.py.
"""

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref

from zmqflow.common.errors import DeadlineExceededError, UnavailableError

_OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
"""A process group of its own, not a session: Linux's autogroup scheduler shares the CPU per session, and
a session per child measurably starved the broker's clients (bench broker batch MB/s 806 -> 712)."""

_LIVE = weakref.WeakSet()
"""Every child not yet stopped, so that none outlives this interpreter (see _stop_leftovers)."""


class ServiceProcess:
    """One child process: its exit code, its log, and a stop that reaches its whole process group."""

    def __init__(self, proc, endpoint, ready_file, log_path, name=None):
        self.proc, self.endpoint, self.ready_file, self.log_path = proc, endpoint, ready_file, log_path
        self.name = name or str(proc.pid)
        _LIVE.add(self)

    @property
    def pid(self):
        return self.proc.pid

    @property
    def returncode(self):
        return self.proc.poll()

    def alive(self):
        return self.proc.poll() is None

    def log(self):
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def signal_group(self, sig):
        """Send `sig` to the child's process group (the child and what it started)."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def terminate(self):
        """SIGTERM to the group, without waiting (Supervisor.stop_all waits for several at once)."""
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)

    def wait_stopped(self, timeout):
        """Wait up to `timeout` s after terminate(), then SIGKILL; returns (exit code, whether it was killed)."""
        killed = False
        try:
            self.proc.wait(max(0.0, timeout))
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.proc.wait(5.0)
            killed = True
        self.signal_group(signal.SIGKILL)  # anything the leader left behind in its group
        _LIVE.discard(self)
        return self.proc.returncode, killed

    def stop(self, timeout=5.0):
        """SIGTERM, wait up to `timeout`, then SIGKILL; returns the exit code."""
        self.terminate()
        return self.wait_stopped(timeout)[0]

    def kill(self):
        """SIGKILL now (a crash, for fault tests): the child alone, not what it started."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def spawn(argv, name, log_path=None, env=None, cwd=None, stdout=None):
    """Start argv in its own process group; output to `log_path`, or to `stdout` (e.g. subprocess.PIPE)."""
    if log_path is not None:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                    env=env, **_OWN_GROUP)
    else:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.STDOUT if stdout else None,
                                stdin=subprocess.DEVNULL, cwd=cwd, env=env, **_OWN_GROUP)
    return ServiceProcess(proc, None, None, log_path, name=name)


def start_service(module, args=(), bind="tcp://127.0.0.1:*", ready_timeout=30.0, env=None, log_dir=None, name=None,
                  prefix=()):
    """Run `python -m module --bind ... --ready-file ...` and wait until it serves. `prefix`: a command that
    runs the rest in place (e.g. `ip netns exec NAME`: the service in a network namespace of its own)."""
    log_dir = log_dir or tempfile.mkdtemp(prefix="zmqflow-")
    ready = os.path.join(log_dir, f"{module}.{os.getpid()}.{time.monotonic_ns()}.ready")
    log_path = ready[:-6] + ".log"
    argv = [*prefix, sys.executable, "-m", module, "--bind", bind, "--ready-file", ready, *args]
    child = spawn(argv, name or module, log_path, env={**os.environ, **(env or {})})
    child.ready_file = ready
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if os.path.exists(ready):
            with open(ready) as f:
                child.endpoint = f.read().strip()
            return child
        if not child.alive():
            _LIVE.discard(child)
            raise UnavailableError(f"{module} exited with {child.returncode} before serving:\n{_tail(log_path)}")
        time.sleep(0.02)
    child.stop(timeout=1.0)
    raise DeadlineExceededError(f"{module} did not serve within {ready_timeout} s:\n{_tail(log_path)}")


def start_process(module, args=(), env=None, log_dir=None, name=None, prefix=()):
    """Run `python -m module args...` (a worker: no endpoint to wait for), logging to a file; `prefix` as
    start_service's."""
    log_dir = log_dir or tempfile.mkdtemp(prefix="zmqflow-")
    log_path = os.path.join(log_dir, f"{name or module}.{time.monotonic_ns()}.log")
    return spawn([*prefix, sys.executable, "-m", module, *args], name or module, log_path,
                 env={**os.environ, **(env or {})})


def compute_thread_env(threads):
    """Environment that caps BLAS/OpenMP/numba threads of a compute process (set before numpy loads)."""
    n = str(max(1, int(threads)))
    return {"OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "NUMBA_NUM_THREADS": n}


@atexit.register
def _stop_leftovers():
    """No child outlives its owner: what is still running when the interpreter exits is stopped."""
    leftovers = [child for child in list(_LIVE) if child.alive()]
    for child in leftovers:
        child.terminate()
    deadline = time.monotonic() + 5.0
    for child in leftovers:
        child.wait_stopped(deadline - time.monotonic())


def _tail(path, lines=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""
