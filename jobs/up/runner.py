"""Start localized services in dependency order, follow them, stop every one by process group.

Each service runs in its own session (process group), so a stop reaches the
children it started too; Ctrl-C or SIGTERM to `zmqflow up` stops them all.
A service's exit is reported with its code. A service whose compose `restart:`
policy asks for it (the serving ones: `unless-stopped`) is started again after a
back-off, as Docker does: 0.1 s, doubled after each exit that came within 10 s of
its start, at most 60 s. The run ends when the service named by `exit_code_from`
exits (its code is the result), when any service fails for good and
`abort_on_failure` is set, when a dependency can no longer be met, or when every
service has exited for good.

`status` holds each service's state as `zmqflow compose ps` shows it (running,
restarting, exited; pid, restarts, health); `on_change` hears every change
(the detached run writes it to the project folder, jobs/up/state.py).
"""

import os
import signal
import subprocess
import time

from zmqflow.common.processes.supervisor import Supervisor
from zmqflow.jobs.up.health import HealthWatch
from zmqflow.jobs.up.localize import child_environment

INTERRUPTED = 130
BACKOFF_FIRST, BACKOFF_MAX, BACKOFF_RESET = 0.1, 60.0, 10.0   # seconds, as Docker's restart manager


class Runner:
    def __init__(self, services, prefixer, cwd, exit_code_from=None, abort_on_failure=False, stop_timeout=10.0,
                 health_limit=120.0, on_change=None):
        self.services = {s.name: s for s in services}
        self.order = [s.name for s in services]          # already in start order
        self.out, self.cwd = prefixer, cwd
        self.exit_code_from, self.abort_on_failure = exit_code_from, abort_on_failure
        self.stop_timeout, self.health_limit = stop_timeout, health_limit
        self.supervisor = Supervisor(stop_timeout=stop_timeout)
        self.procs, self.codes, self.health, self.pumps = {}, {}, {}, []
        self.pending = {}                # name -> when its restart is due (time.monotonic())
        self.restarts = dict.fromkeys(self.order, 0)
        self._quick_exits = dict.fromkeys(self.order, 0)
        self._started_at = {}
        self.status = {name: {"state": "created"} for name in self.order}
        self.on_change = on_change or (lambda runner: None)
        self._signal = None

    # ------------------------------------------------ the run

    def run(self):
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._loop()
        finally:
            self.stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum, frame):
        self._signal = signum

    def _loop(self):
        while True:
            if self._signal is not None:
                self.out.note(f"zmqflow up: {signal.Signals(self._signal).name}, stopping every service")
                return INTERRUPTED
            now = time.monotonic()
            for name, due in list(self.pending.items()):
                if now >= due:
                    del self.pending[name]
                    self.restarts[name] += 1
                    self._start(name)
            for name in self.order:
                if name not in self.procs:
                    verdict = self._dependencies(name)
                    if verdict is True:
                        self._start(name)
                    elif verdict is not None:
                        self.out.note(f"zmqflow up: {name} cannot start: {verdict}; stopping every service")
                        return 1
            result = self._reap()
            if result is not None:
                return result
            if len(self.codes) == len(self.services):
                return 0 if not any(self.codes.values()) else 1
            time.sleep(0.05)

    def _dependencies(self, name):
        """True when `name` may start, None to wait, or why it never will."""
        for dep, condition in self.services[name].depends_on.items():
            if dep not in self.services:
                continue                               # not selected (--no-deps)
            if dep not in self.procs:
                return None
            if condition == "service_healthy":
                watch = self.health.get(dep)
                if watch is None:
                    return f"depends on {dep} being healthy, but {dep} has no healthcheck"
                if watch.state in ("unhealthy", "exited"):   # a dependent needs it healthy and running
                    return f"{dep} is {watch.state} ({watch.detail})"
                if watch.state != "healthy":
                    return None
            elif condition == "service_completed_successfully":
                if dep not in self.codes:
                    return None
                if self.codes[dep] != 0:
                    return f"{dep} exited with code {self.codes[dep]}"
        return True

    def _start(self, name):
        service = self.services[name]
        for directory in service.dirs:
            os.makedirs(directory, exist_ok=True)
        env = child_environment(service.env)
        try:
            proc = self.supervisor.start(name, service.argv, env=env, cwd=self.cwd, stdout=subprocess.PIPE)
        except OSError as exc:
            self.out.note(f"zmqflow up: {name} cannot start {service.argv[0]!r}: {exc}")
            self.procs[name], self.codes[name] = None, 127
            self._set(name, state="exited", exit_code=127)
            return
        self.procs[name], self._started_at[name] = proc, time.monotonic()
        again = f", restart {self.restarts[name]}" if self.restarts[name] else ""
        self.out.note(f"zmqflow up: {'restarted' if again else 'started'} {name} (pid {proc.pid}{again})")
        self.pumps.append(self.out.follow(name, proc.proc.stdout))
        if service.health:
            self.health[name] = HealthWatch(service, self.cwd, env, proc.alive, self.health_limit,
                                            on_change=lambda watch, name=name: self._set(name, health=watch.state),
                                            exit_code=proc.proc.poll)
            self.health[name].start()
        self._set(name, state="running", pid=proc.pid, exit_code=None, restarts=self.restarts[name],
                  health="starting" if service.health else None)

    def _set(self, name, **fields):
        self.status[name].update(fields)
        self.on_change(self)

    def _restarts(self, name, code):
        """Whether `name`'s exit with `code` restarts it (its policy, and no stop under way); schedules it."""
        policy = self.services[name].restart
        if self._signal is not None or policy is None or not policy.restarts_after(code, self.restarts[name]):
            return False
        if time.monotonic() - self._started_at.get(name, 0.0) >= BACKOFF_RESET:
            self._quick_exits[name] = 0
        delay = min(BACKOFF_FIRST * 2 ** self._quick_exits[name], BACKOFF_MAX)
        self._quick_exits[name] += 1
        self.pending[name] = time.monotonic() + delay
        self.out.note(f"zmqflow up: {name} exited with code {code}; restarting it in {delay:.1f} s "
                      f"(restart: {policy})")
        self._set(name, state="restarting", exit_code=code)
        return True

    def _reap(self):
        """Report exits; the run's result when one of them ends it, else None."""
        for name, proc in self.procs.items():
            if proc is None or name in self.codes or name in self.pending or proc.alive():
                continue
            if self._restarts(name, proc.returncode):
                continue
            code = self.codes[name] = proc.returncode
            self.out.note(f"zmqflow up: {name} exited with code {code}")
            self._set(name, state="exited", exit_code=code)
            if code != 0 and (self.abort_on_failure or name == self.exit_code_from):
                return self._failed(name, code)
            if name == self.exit_code_from:
                self._let_others_finish()
                self.out.note(f"zmqflow up: {name} is done, stopping every service")
                return code
        for name, code in self.codes.items():
            if self.procs[name] is None and name == self.exit_code_from:
                return code
        return None

    def _failed(self, name, code):
        """Say which service failed, how, and its last lines; the run's exit code (128 + N for signal N)."""
        time.sleep(0.2)   # the last lines it wrote reach its log pump
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        tail = "".join(f"\n  {line}" for line in self.out.tail(name))
        self.out.note(f"zmqflow up: {name} failed: it {how}; stopping every service. "
                      f"Its last log lines:{tail or ' (none)'}")
        return code if code > 0 else 128 - code

    # ------------------------------------------------ stopping

    def _let_others_finish(self, grace=3.0):
        """The chief just told the ps shards and the broker to exit: give them `grace` s to do so
        by themselves (a SIGTERM to a process already shutting down ends it with -15, not 0)."""
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            alive = [n for n, p in self.procs.items() if p is not None and n not in self.codes and p.alive()]
            for name, proc in self.procs.items():
                if proc is not None and name not in self.codes and not proc.alive():
                    self.codes[name] = proc.returncode
                    self.out.note(f"zmqflow up: {name} exited with code {proc.returncode}")
                    self._set(name, state="exited", exit_code=proc.returncode)
            if not alive:
                return
            time.sleep(0.05)

    def stop_all(self):
        """SIGTERM to every live process group (dependents first), SIGKILL after stop_timeout."""
        for watch in self.health.values():
            watch.stop()

        def report(child, code, killed):
            if killed:
                self.out.note(f"zmqflow up: {child.name} did not stop within {self.stop_timeout:.0f} s, killed it")
            self.codes[child.name] = code
            self.out.note(f"zmqflow up: {child.name} exited with code {code}")
            self._set(child.name, state="exited", exit_code=code)

        for name in self.pending:
            self._set(name, state="exited")
        self.pending.clear()
        self.supervisor.stop_all(report=report)
        for pump in self.pumps:
            pump.join(2.0)
