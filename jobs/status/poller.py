"""Snapshots taken on a schedule of their own, for the web view: the latest one and the curves so far.

Why a thread that polls rather than a probe per page request: every open page (and every refresh)
then costs the cluster nothing more, the steps/s rates compare snapshots a steady interval apart,
and the history keeps growing while nobody looks.
"""

import threading
import time

from zmqflow.jobs.status.history import History
from zmqflow.jobs.status.probe import add_rates, snapshot


class Poller:
    def __init__(self, spec, worker_metrics=(), interval=1.0, timeout=1.0, history=None):
        self.spec, self.worker_metrics = spec, list(worker_metrics)
        self.interval, self.timeout = interval, timeout
        self.history = history if history is not None else History()
        self.latest = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def poll_once(self):
        """One snapshot, with rates against the previous one, recorded in the history."""
        snap = snapshot(self.spec, self.worker_metrics, self.timeout)
        with self._lock:
            add_rates(snap, self.latest)
            self.history.record(snap)
            self.latest = snap
        return snap

    def read(self):
        """(latest snapshot or None, the history's series), consistent with each other."""
        with self._lock:
            return self.latest, self.history.series()

    def start(self):
        self._thread = threading.Thread(target=self._run, name="status-poller", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + self.interval + 1.0)   # a snapshot in flight ends within its timeout

    def _run(self):
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll_once()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))
