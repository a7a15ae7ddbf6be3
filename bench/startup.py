"""`zmqflow bench startup`: how long each task takes from exec to ready, and its memory at rest.

Every role is started as a user starts it, `zmqflow <role> ...` (the console script next to this
interpreter), in the order a job starts them (broker, ps, reader, worker, model server, aggregator,
gateway), each one's dependencies already up. Ready means what the project's healthchecks ask
(`zmqflow up`, the image's HEALTHCHECK):

  broker, ps, serve, aggregator   the ping over ZeroMQ answers (after the ready file names the endpoint)
  gateway                         GET /v2/health/ready answers 200 (its model server behind it is up)
  reader                          its queue is on the broker (`zmqflow queues | grep`, its check in `zmqflow up`)
  worker                          its first step's gradients are applied on the ps (version >= 1): a worker
                                  only dials out, its own healthcheck passes at once; the reader feeds a FIFO
                                  queue, so the first batch waits for no shuffle buffer

RSS at rest: VmRSS of the task and every process it started, summed, `settle_s` after it was ready; of it,
rss_anon_mb is the processes' own memory (RssAnon) and rss_file_mb the pages of mapped files (RssFile: shared
libraries' code, such as numba's LLVM, which every process mapping the same file shares in the page cache).
The baseline, in each round before the roles: a bare `python -c "import zmq, numpy"`, exec to exit,
and its RSS. Medians over `rounds` starts; targets: ready <= 1 s, RSS <= 150 MB (issue 26, item 6).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from zmqflow.common.clients.broker import BrokerClient
from zmqflow.common.errors import DeadlineExceededError, UnavailableError
from zmqflow.common.processes.supervisor import Supervisor
from zmqflow.common.rpc import health
from zmqflow.common.rpc.probe import probe

ROLES = ("broker", "ps", "reader", "worker", "serve", "aggregator", "gateway")
"""In start order: each role's dependencies come before it."""
TARGET_READY_S = 1.0
TARGET_RSS_MB = 150.0
BASELINE_CODE = "import zmq, numpy"
MB = 1024 * 1024


def zmqflow_command():
    """The `zmqflow` console script of this environment (what a user runs), else `python -m zmqflow`."""
    script = os.path.join(os.path.dirname(sys.executable), "zmqflow")
    return [script] if os.access(script, os.X_OK) else [sys.executable, "-m", "zmqflow"]


def tree_rss_bytes(pid):
    """(VmRSS, RssFile, RssAnon) of `pid` and of every descendant, summed (a reader's or gateway's own children
    count). RssFile and RssAnon are parts of VmRSS: the resident pages of mapped files (shared libraries' code),
    which other processes mapping the same files share, and the processes' own memory."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    rss = file = anon = 0
    todo = [pid]
    while todo:
        current = todo.pop()
        todo += children.get(current, [])
        try:
            with open(f"/proc/{current}/status") as f:
                status = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS:", "RssFile:", "RssAnon:")))
        except OSError:
            continue   # exited meanwhile
        rss += int(status.get("VmRSS", "0 kB").split()[0]) * 1024
        file += int(status.get("RssFile", "0 kB").split()[0]) * 1024
        anon += int(status.get("RssAnon", "0 kB").split()[0]) * 1024
    return rss, file, anon


def baseline():
    """(seconds from exec to exit, RSS bytes) of a bare interpreter importing zmq and numpy."""
    code = f"{BASELINE_CODE}; import sys; sys.stdout.write(open('/proc/self/status').read())"
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    seconds = time.perf_counter() - started
    rss = next(int(line.split()[1]) * 1024 for line in out.splitlines() if line.startswith("VmRSS:"))
    return seconds, rss


def _wait(ready, child, what, timeout, poll_s=0.005):
    """Poll `ready()` until true; the task exiting or `timeout` s passing is an error naming `what`."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if ready():
            return time.perf_counter()
        if not child.alive():
            raise UnavailableError(f"{what} exited with {child.returncode} before it was ready:\n{child.log()}")
        time.sleep(poll_s)
    raise DeadlineExceededError(f"{what} was not ready within {timeout} s:\n{child.log()}")


class Round:
    """One start of every role, in order, each waited for; `stop()` ends them all."""

    def __init__(self, workdir, checkpoint, timeout, backend=None):
        self.workdir, self.checkpoint, self.timeout, self.backend = workdir, checkpoint, timeout, backend
        self.supervisor = Supervisor(log_dir=workdir)
        self.endpoints, self.children = {}, {}

    def _start(self, role, args):
        ready_file = os.path.join(self.workdir, f"{role}.{time.monotonic_ns()}.ready")
        argv = [*zmqflow_command(), role, *args]
        log = os.path.join(self.workdir, f"{role}.{time.monotonic_ns()}.log")
        started = time.perf_counter()
        child = self.supervisor.start(role, argv + (["--ready-file", ready_file] if role in SERVICES else []),
                                      log_path=log)
        return child, started, ready_file, argv

    def _endpoint(self, child, ready_file, role):
        def written():
            try:
                with open(ready_file) as f:
                    self.endpoints[role] = f.read().strip()
                return bool(self.endpoints[role])
            except OSError:
                return False
        _wait(written, child, role, self.timeout)
        return self.endpoints[role]

    def start(self, role):
        """(child, seconds from exec to ready, argv) of `role` started now."""
        child, started, ready_file, argv = self._start(role, self.arguments(role))
        if role in SERVICES:
            endpoint = self._endpoint(child, ready_file, role)
            if role == "gateway":
                url = health.local_endpoint(endpoint) + health.HTTP_READY_PATH
                ready_at = _wait(lambda: health.http_ready(url, 1.0)[0], child, role, self.timeout)
            else:
                ready_at = _wait(lambda: probe(endpoint, timeout=1.0).up, child, role, self.timeout)
        elif role == "reader":
            with BrokerClient(self.endpoints["broker"]) as broker:
                def queued():
                    return any(q["name"] == "train" for q in broker.list_queues(timeout=2.0))
                ready_at = _wait(queued, child, role, self.timeout, poll_s=0.01)
        else:   # worker
            def stepped():
                answer = probe(self.endpoints["ps"], timeout=1.0)
                return answer.up and answer.info.get("version", 0) >= 1
            ready_at = _wait(stepped, child, role, self.timeout, poll_s=0.01)
        return child, ready_at - started, argv

    def arguments(self, role):
        local = ["--bind", "tcp://127.0.0.1:*"]
        kernels = ["--backend", self.backend] if self.backend and role in ("worker", "serve") else []
        if role in ("broker", "ps"):
            return local
        if role == "reader":
            return ["--broker", self.endpoints["broker"], "--preset", "mnist-csv", "--num-epochs", "0",
                    "--queue-kind", "fifo"]
        if role == "worker":
            return ["--broker", self.endpoints["broker"], "--ps", self.endpoints["ps"], "--log-every", "1000", *kernels]
        if role == "serve":
            return [*local, "--checkpoint", self.checkpoint, *kernels]
        if role == "aggregator":
            return [*local, "--member", self.endpoints["serve"]]
        return ["--bind", "127.0.0.1:0", "--aggregator", self.endpoints["aggregator"]]   # gateway: HTTP, no `*`

    def stop(self):
        self.supervisor.stop_all()


SERVICES = ("broker", "ps", "serve", "aggregator", "gateway")
"""Roles that listen: started with --bind and --ready-file."""
NEEDS = {"reader": ("broker",), "worker": ("broker", "ps", "reader"), "aggregator": ("serve",),
         "gateway": ("serve", "aggregator")}
"""What a role needs up before it starts (`roles` is closed over these)."""
CLIENTS = ("worker", "reader")
"""Roles that work once ready: stopped once measured (the worker first), so they do not load the later starts."""


def with_dependencies(roles):
    """`roles` and what they need, in start order."""
    wanted = set(roles)
    for role in roles:
        wanted.update(NEEDS.get(role, ()))
    return [role for role in ROLES if role in wanted]


def run(roles=ROLES, rounds=3, settle_s=1.0, timeout=60.0, backend=None, progress=None):
    """{"roles": {role: ready_s, rss_mb, ...}, "baseline": ...} with medians of `rounds` starts of each role;
    `backend`: the worker's and model server's --backend (default: theirs, numba)."""
    say = progress or (lambda *_: None)
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise ValueError(f"unknown roles {unknown}: choose from {', '.join(ROLES)}")
    order = with_dependencies(roles)
    samples = {role: {"ready_s": [], "rss_bytes": [], "rss_file_bytes": [], "rss_anon_bytes": []}
               for role in order}
    samples["baseline"] = {"ready_s": [], "rss_bytes": []}
    commands = {}
    with tempfile.TemporaryDirectory(prefix="zmqflow-bench-startup-") as workdir:
        checkpoint = None
        if "serve" in order:
            from zmqflow.bench.serve import write_random_checkpoint
            checkpoint = os.path.join(workdir, "checkpoint")
            write_random_checkpoint(checkpoint)
        for number in range(rounds):
            seconds, rss = baseline()
            samples["baseline"]["ready_s"].append(seconds)
            samples["baseline"]["rss_bytes"].append(rss)
            this = Round(workdir, checkpoint, timeout, backend)
            try:
                for role in order:
                    child, seconds, argv = this.start(role)
                    time.sleep(settle_s)
                    samples[role]["ready_s"].append(seconds)
                    rss, rss_file, rss_anon = tree_rss_bytes(child.pid)
                    samples[role]["rss_bytes"].append(rss)
                    samples[role]["rss_file_bytes"].append(rss_file)
                    samples[role]["rss_anon_bytes"].append(rss_anon)
                    commands[role] = " ".join(["zmqflow", *argv[len(zmqflow_command()):]]).replace(workdir, "$TMP")
                    say(f"round {number + 1}: {role} ready in {seconds:.3f} s, "
                        f"RSS {samples[role]['rss_bytes'][-1] / MB:.1f} MB")
                    this.children[role] = child
                    if role == "worker" or (role == "reader" and "worker" not in order):
                        for client in CLIENTS:   # they work on: stopped, so that they do not slow the next starts
                            if client in this.children:
                                this.children[client].stop()
            finally:
                this.stop()
    return {**_report(order, samples, commands, rounds, settle_s), "backend": backend or "default"}


def _report(order, samples, commands, rounds, settle_s):
    base_s = statistics.median(samples["baseline"]["ready_s"])
    base_rss = statistics.median(samples["baseline"]["rss_bytes"])
    result = {"benchmark": "startup", "rounds": rounds, "settle_s": settle_s, "target_ready_s": TARGET_READY_S,
              "target_rss_mb": TARGET_RSS_MB,
              "baseline": {"command": f'python -c "{BASELINE_CODE}"', "ready_s": round(base_s, 3),
                           "rss_mb": round(base_rss / MB, 1)}, "roles": {}}
    for role in order:
        ready = statistics.median(samples[role]["ready_s"])
        rss = statistics.median(samples[role]["rss_bytes"])
        result["roles"][role] = {
            "command": commands[role], "ready_s": round(ready, 3),
            "ready_s_each": [round(s, 3) for s in samples[role]["ready_s"]],
            "rss_mb": round(rss / MB, 1), "rss_file_mb": round(statistics.median(samples[role]["rss_file_bytes"]) / MB, 1),
            "rss_anon_mb": round(statistics.median(samples[role]["rss_anon_bytes"]) / MB, 1),
            "ready_over_baseline": round(ready / base_s, 2),
            "rss_over_baseline": round(rss / base_rss, 2),
            "ready_ok": ready <= TARGET_READY_S, "rss_ok": rss / MB <= TARGET_RSS_MB}
    result["all_ok"] = all(r["ready_ok"] and r["rss_ok"] for r in result["roles"].values())
    return result


if __name__ == "__main__":
    print(json.dumps(run(progress=print)))
