"""Processes a test starts, stopped by PID when it ends, whether it passed or failed.

Built on zmqflow.common.processes: `service` is start_service (waits until it serves, knows its
endpoint), `process` is start_process (a worker, a reader: nothing to wait for). The fixtures
`processes` (per test) and `module_processes` (per module) in tests/conftest.py own one each.
"""

import os
import signal
import subprocess

from zmqflow.common.processes import start_process, start_service


class Processes:
    """A registry of started processes; `stop_all` (the fixtures' teardown) stops each by PID."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.started = []

    def service(self, module, args=(), **options):
        """start_service(module, args, ...), logging into this registry's directory unless told otherwise."""
        options.setdefault("log_dir", self.log_dir)
        return self.adopt(start_service(module, args, **options))

    def process(self, module, args=(), **options):
        """start_process(module, args, ...), logging into this registry's directory unless told otherwise."""
        options.setdefault("log_dir", self.log_dir)
        return self.adopt(start_process(module, args, **options))

    def adopt(self, proc):
        """Stop `proc` (a ServiceProcess another helper started) with the others."""
        self.started.append(proc)
        return proc

    def stop_all(self):
        """Stop every process, newest first (clients before their services); a paused one is woken first."""
        errors = []
        while self.started:
            proc = self.started.pop()
            try:
                if proc.alive():
                    os.kill(proc.pid, signal.SIGCONT)  # a SIGSTOPped process would sit out SIGTERM's grace
                proc.stop()
            except (OSError, subprocess.SubprocessError) as error:
                errors.append(f"pid {proc.pid}: {error!r}")
        if errors:
            raise RuntimeError("could not stop: " + "; ".join(errors))
