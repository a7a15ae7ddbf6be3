"""Run a service's healthcheck command locally until it passes, bounded; the result in `state`."""

import subprocess
import threading
import time


class HealthWatch:
    """state: 'checking', then 'healthy', 'unhealthy' (never passed within `limit` seconds, or the service
    failed first) or 'exited' (it finished, exit 0, before a check passed: a reader whose epochs took a
    fraction of a second is done, not unhealthy; as in Docker, an exited container has no health). Checks
    every `period` s (the compose interval, at most 0.5 s: locally a check is cheap and start-up is what we
    wait for). `exit_code()`: the service's exit code once it has exited."""

    def __init__(self, service, cwd, env, alive, limit, on_change=None, exit_code=lambda: None):
        self.service, self.cwd, self.env, self.alive, self.limit = service, cwd, env, alive, limit
        self.exit_code = exit_code
        check = service.check
        self.period = min(check.interval, check.start_interval, 0.5)
        self.timeout = max(1.0, check.timeout)
        self.state, self.detail = "checking", ""
        self.on_change = on_change or (lambda watch: None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"health-{service.name}", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()

    def _run(self):
        deadline = time.monotonic() + self.limit
        while not self._stop.is_set():
            if not self.alive():
                if self.exit_code() == 0:
                    self.state, self.detail = "exited", "it finished (exit 0) before its healthcheck passed"
                else:
                    self.state, self.detail = "unhealthy", "it exited before its healthcheck passed"
                return self.on_change(self)
            if self._check():
                self.state = "healthy"
                return self.on_change(self)
            if time.monotonic() > deadline:
                self.state = "unhealthy"
                self.detail = f"its healthcheck did not pass within {self.limit:.0f} s: {self.detail}"
                return self.on_change(self)
            self._stop.wait(self.period)

    def _check(self):
        try:
            done = subprocess.run(self.service.health, cwd=self.cwd, env=self.env, timeout=self.timeout,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except subprocess.TimeoutExpired:
            self.detail = f"the check took longer than {self.timeout:.0f} s"
            return False
        except OSError as exc:
            self.detail = f"the check cannot run: {exc}"
            return False
        self.detail = done.stdout.decode("utf-8", "replace").strip()[-300:]
        return done.returncode == 0
