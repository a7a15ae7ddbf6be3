"""The project folder of `zmqflow up`: where a run keeps its volumes, its state and its logs.

Compose keeps a project's containers, their state and logs in the Docker daemon, so `docker compose ps`,
`logs` and `down` work from any shell. `zmqflow up` keeps the same in a folder: `.zmqflow-up/` next to the
compose file (--workdir elsewhere), holding

    <volume>/       each named volume of the file (zmqflow-data, zmqflow-keys: the CURVE keys)
    run.json        what the run starts: the localized services (argv, environment, healthcheck, restart)
    state.json      what runs now: the supervising process and each service's pid, state, restarts, health
    logs/NAME.log   each service's output (appended across restarts)
    up.log          a detached run's own messages (started, exited, restarting, stopped)

A pid is written with its process's start time (/proc), so `down` never signals a process that merely
reuses a pid of a run that ended long ago.
"""

import dataclasses
import json
import os
import shutil
import signal
import threading
import time

from zmqflow.jobs.up.compose import Healthcheck, RestartPolicy
from zmqflow.jobs.up.localize import LocalService

FOLDER = ".zmqflow-up"


def default_workdir(compose_file):
    """`.zmqflow-up` in the compose file's directory (Compose's project directory)."""
    return os.path.join(os.path.dirname(os.path.abspath(compose_file)), FOLDER)


class ProjectFolder:
    def __init__(self, workdir):
        self.workdir = os.path.abspath(workdir)
        self.state_path = os.path.join(self.workdir, "state.json")
        self.run_path = os.path.join(self.workdir, "run.json")
        self.log_dir = os.path.join(self.workdir, "logs")
        self.up_log = os.path.join(self.workdir, "up.log")

    def log_path(self, name):
        return os.path.join(self.log_dir, f"{name}.log")

    def state(self):
        """The last state a run wrote, or None when nothing was ever up here (or `down` cleared it)."""
        return _read_json(self.state_path)

    def run(self):
        return _read_json(self.run_path)

    def new_run(self, run):
        """Start a run's files: run.json, empty logs (a previous run's are dropped, as `down` drops containers)."""
        os.makedirs(self.workdir, exist_ok=True)
        shutil.rmtree(self.log_dir, ignore_errors=True)
        os.makedirs(self.log_dir)
        for path in (self.up_log, self.state_path):
            if os.path.exists(path):
                os.remove(path)
        _write_json(self.run_path, run)

    def clear(self, volumes=False):
        """What `down` removes: the state (and with `volumes` every volume directory the run used; run.json and
        the logs stay until the next run, for `zmqflow logs`)."""
        run = self.run() or {}
        if os.path.exists(self.state_path):
            os.remove(self.state_path)
        removed = []
        if volumes:
            for directory in sorted({d for s in run.get("services", []) for d in s.get("dirs", [])}):
                inside = os.path.commonpath([self.workdir, os.path.abspath(directory)]) == self.workdir
                if inside and os.path.isdir(directory):   # bind mounts of the user's own folders stay
                    shutil.rmtree(directory)
                    removed.append(directory)
        return removed


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _write_json(path, data):
    """Atomically: a reader (`ps` in another shell) never sees half a file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


# ------------------------------------------------------------------ the run's services, as files


def services_to_json(services):
    return [dataclasses.asdict(s) for s in services]


def services_from_json(items):
    services = []
    for item in items:
        item = dict(item)
        item["check"] = Healthcheck(**item["check"]) if item.get("check") else None
        item["restart"] = RestartPolicy(**item["restart"]) if item.get("restart") else RestartPolicy()
        services.append(LocalService(**item))
    return services


# ------------------------------------------------------------------ processes


def start_time(pid):
    """The start time of process `pid` (clock ticks since boot, /proc/PID/stat field 22), None when it is gone."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except (OSError, ValueError, TypeError):
        return None
    fields = text.rsplit(")", 1)[-1].split()
    state = fields[0] if fields else "X"
    return None if state in ("Z", "X") else fields[19]   # a zombie has exited


def alive(pid, started):
    """Whether `pid` is still the process that was started then."""
    return pid is not None and started is not None and start_time(pid) == started


class StateWriter:
    """Runner.on_change: writes state.json on every change of the run (from the runner's and its health
    watches' threads, hence the lock)."""

    def __init__(self, folder, compose_file, detached):
        self.folder, self.lock = folder, threading.Lock()
        self.header = {"compose_file": os.path.abspath(compose_file), "workdir": folder.workdir,
                       "detached": detached, "supervisor": {"pid": os.getpid(), "started": start_time(os.getpid())},
                       "keys": os.path.join(folder.workdir, "zmqflow-keys"), "since": time.time()}
        self._starts = {}

    def __call__(self, runner, ended=None):
        with self.lock:
            services = {}
            for name in runner.order:
                status = dict(runner.status[name])
                pid = status.get("pid")
                if pid is not None and pid not in self._starts:
                    self._starts[pid] = start_time(pid)
                status["started"] = self._starts.get(pid)
                service = runner.services[name]
                services[name] = {**status, "ports": list(service.ports), "restart": str(service.restart),
                                  "log": self.folder.log_path(name)}
            _write_json(self.folder.state_path, {**self.header, "ended": ended, "services": services})


def supervisor_alive(state):
    sup = (state or {}).get("supervisor") or {}
    return alive(sup.get("pid"), sup.get("started"))


def live_services(state):
    """{name: pid} of the state's services still running as the processes that run started."""
    return {name: s["pid"] for name, s in (state or {}).get("services", {}).items()
            if s.get("state") in ("running", "restarting") and alive(s.get("pid"), s.get("started"))}


def stop(state, timeout=10.0, note=print):
    """Stop the run of `state`: SIGTERM to its supervising process, which stops every service in order (the
    last started first, SIGKILL after its --timeout) and exits; then any service process still running (its
    supervisor was killed, or did not stop them in time) by process group, SIGTERM then SIGKILL after
    `timeout`. Returns the names of the services that were running."""
    running = live_services(state)
    sup = state.get("supervisor") or {}
    if supervisor_alive(state):
        os.kill(sup["pid"], signal.SIGTERM)
        deadline = time.monotonic() + timeout * (len(running) + 1) + 5
        while supervisor_alive(state) and time.monotonic() < deadline:
            time.sleep(0.05)
        if supervisor_alive(state):
            note(f"zmqflow down: the run's supervisor (pid {sup['pid']}) did not stop in time; killing it")
            os.kill(sup["pid"], signal.SIGKILL)
    left = live_services(state)
    for name, pid in left.items():
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while live_services(state) and time.monotonic() < deadline:
        time.sleep(0.05)
    for name, pid in live_services(state).items():
        note(f"zmqflow down: {name} (pid {pid}) did not stop within {timeout:.0f} s; killed it")
        _signal_group(pid, signal.SIGKILL)
    for name, pid in left.items():    # what the leader left behind in its group
        _signal_group(pid, signal.SIGKILL)
    return list(running)


def _signal_group(pid, sig):
    try:
        os.killpg(pid, sig)      # every service is the leader of its own process group
    except (ProcessLookupError, PermissionError):
        pass
