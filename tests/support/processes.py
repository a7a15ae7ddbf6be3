"""Processes a test starts, stopped by PID when it ends, whether it passed or failed.

The tests own their processes as every job does, through zmqflow's Supervisor: `service` waits
until the service serves and knows its endpoint, `process` starts a worker or a reader (nothing
to wait for). The fixtures `processes` (per test) and `module_processes` (per module) in
tests/conftest.py own one each.
"""

import os
import signal

from zmqflow.common.processes.supervisor import Supervisor


class Processes(Supervisor):
    """A test's Supervisor; `stop_all` (the fixtures' teardown) also wakes paused (SIGSTOPped) ones first."""

    def __init__(self, log_dir):
        super().__init__(log_dir=log_dir)

    def service(self, module, args=(), **options):
        return self.start_service(module, args, **options)

    def process(self, module, args=(), **options):
        return self.start_process(module, args, **options)

    def stop_all(self, timeout=None, report=None):
        """Stop every process, newest first (clients before their services)."""
        for child in self.running():
            child.signal_group(signal.SIGCONT)   # a paused process would sit out SIGTERM's grace
        return super().stop_all(timeout, report)


def alive(pid):
    """Whether a process `pid` exists (a zombie counts until reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
