"""Start service processes and stop them by PID: for launchers, tests and benchmarks.

A service started here binds an ephemeral loopback port (`tcp://127.0.0.1:*`)
and writes the endpoint it got to a ready file; `start_service` waits for that
file (bounded), so callers never guess ports or sleep.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

from zmqflow.common.errors import DeadlineExceededError, UnavailableError


class ServiceProcess:
    def __init__(self, proc, endpoint, ready_file, log_path):
        self.proc, self.endpoint, self.ready_file, self.log_path = proc, endpoint, ready_file, log_path

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self, timeout=5.0):
        """SIGTERM, wait up to `timeout`, then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode

    def kill(self):
        """SIGKILL now (a crash, for fault tests)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_service(module, args=(), bind="tcp://127.0.0.1:*", ready_timeout=30.0, env=None, log_dir=None):
    """Run `python -m module --bind ... --ready-file ...` and wait until it serves."""
    log_dir = log_dir or tempfile.mkdtemp(prefix="zmqflow-")
    ready = os.path.join(log_dir, f"{module}.{os.getpid()}.{time.monotonic_ns()}.ready")
    log_path = ready[:-6] + ".log"
    argv = [sys.executable, "-m", module, "--bind", bind, "--ready-file", ready, *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if os.path.exists(ready):
            with open(ready) as f:
                return ServiceProcess(proc, f.read().strip(), ready, log_path)
        if proc.poll() is not None:
            raise UnavailableError(f"{module} exited with {proc.returncode} before serving:\n{_tail(log_path)}")
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    raise DeadlineExceededError(f"{module} did not serve within {ready_timeout} s:\n{_tail(log_path)}")


def start_process(module, args=(), env=None, log_dir=None, name=None):
    """Run `python -m module args...` (a worker: no endpoint to wait for), logging to a file."""
    log_dir = log_dir or tempfile.mkdtemp(prefix="zmqflow-")
    log_path = os.path.join(log_dir, f"{name or module}.{time.monotonic_ns()}.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
    return ServiceProcess(proc, None, None, log_path)


def compute_thread_env(threads):
    """Environment that caps BLAS/OpenMP/numba threads of a compute process (set before numpy loads)."""
    n = str(max(1, int(threads)))
    return {"OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "NUMBA_NUM_THREADS": n}


def _tail(path, lines=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""
