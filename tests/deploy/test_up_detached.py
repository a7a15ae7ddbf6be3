"""zmqflow up -d, compose ps, logs and down, and restart policies, for real: processes followed by pid from
other shells (other `zmqflow` processes), a killed serving service restarted with a back-off, a finished one not."""

import http.client
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pytest

from tests.deploy.conftest import COMPOSE, ROOT, compose_ports
from tests.deploy.test_up_processes import ZMQFLOW, gone, up, write
from tests.support import free_port_offset, wait_for
from tests.support.processes import alive

pytestmark = pytest.mark.integration

SERVING = ["serve0", "serve1", "serve2", "aggregator", "gateway"]


def zmqflow(*args, timeout=60, env=None):
    done = subprocess.run([ZMQFLOW, *args], cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def ps(compose, *args):
    code, out = zmqflow("compose", "ps", "-f", compose, "--json", *args)
    assert code == 0, out
    return {row["name"]: row for row in json.loads(out)}


SMALL = """
services:
  server:
    image: python:3.11-slim
    command: ["python", "-c", "import os, time; print('server up', os.getpid(), flush=True); time.sleep(300)"]
    restart: unless-stopped
    healthcheck: {test: ["CMD", "python", "-c", "pass"], interval: 1s}
  once:
    image: python:3.11-slim
    command: ["python", "-c", "print('done once')"]
    restart: on-failure
"""


def test_detached_run_is_followed_restarted_and_stopped_from_other_shells(tmp_path):
    compose = write(tmp_path, SMALL)
    code, out = zmqflow("up", "-f", compose, "-d", "--wait", "--wait-secs", "60")
    assert code == 0 and "detached, supervisor pid" in out and "every service is running and healthy" in out, out
    state = json.loads((tmp_path / ".zmqflow-up" / "state.json").read_text())   # the project folder, as documented
    supervisor = state["supervisor"]["pid"]
    try:
        rows = ps(compose, "-a")
        assert rows["server"]["state"] == "running" and rows["server"]["health"] == "healthy", rows
        assert rows["once"]["state"] == "exited (0)" and rows["once"]["pid"] is None, rows
        assert set(ps(compose)) == {"server"}                               # as docker compose ps: running ones
        first = rows["server"]["pid"]
        code, out = zmqflow("logs", "--file", compose)
        assert code == 0 and f"server  | server up {first}" in out and "once    | done once" in out, out
        code, out = zmqflow("logs", "--file", compose, "--no-log-prefix", "-n", "1", "once")
        assert (code, out) == (0, "done once\n")
        os.kill(first, signal.SIGKILL)                                      # a crash: restart: unless-stopped
        # `ps` without -a lists running services only: between the kill and the restart the server is not there
        wait_for(lambda: (ps(compose).get("server") or {}).get("pid") not in (None, first), 10,
                 "the server to be restarted")
        rows = ps(compose, "-a")
        assert rows["server"]["restarts"] == 1 and rows["once"]["restarts"] == 0, rows   # done: stays done
        second = rows["server"]["pid"]
        code, out = zmqflow("logs", "--file", compose, "server")
        assert f"server up {first}" in out and f"server up {second}" in out, out       # across its restarts
        code, out = zmqflow("up", "-f", compose, "-d")
        assert code == 1 and f"is already up in {tmp_path / '.zmqflow-up'} (pid {supervisor})" in out, out
    finally:
        code, out = zmqflow("down", "-f", compose)
    assert code == 0 and "zmqflow down: stopped server" in out, out
    assert gone(second) and gone(supervisor)
    assert zmqflow("down", "-f", compose) == (0, f"zmqflow down: nothing is up in {tmp_path / '.zmqflow-up'}\n")
    assert zmqflow("compose", "ps", "-f", compose)[1].startswith("nothing is up")


def test_down_stops_the_services_of_a_run_whose_supervisor_was_killed(tmp_path):
    compose = write(tmp_path, SMALL)
    code, out = zmqflow("up", "-f", compose, "-d", "--wait")
    assert code == 0, out
    state = json.loads((tmp_path / ".zmqflow-up" / "state.json").read_text())
    server = state["services"]["server"]["pid"]
    os.kill(state["supervisor"]["pid"], signal.SIGKILL)
    assert gone(state["supervisor"]["pid"]) and alive(server)               # its service runs on, orphaned
    code, out = zmqflow("down", "-f", compose, "--timeout", "2")
    assert code == 0 and "stopped server" in out, out
    assert gone(server)


def test_restart_backs_off_and_on_failure_gives_up_after_its_retries(tmp_path):
    compose = write(tmp_path, """
services:
  crash:
    image: python:3.11-slim
    command: ["python", "-c", "import sys; print('crashing', flush=True); sys.exit(3)"]
    restart: on-failure:3
""")
    code, out = up(["-f", compose, "--no-color"])
    assert code == 1, out
    delays = [float(line.split("restarting it in ")[1].split(" s")[0]) for line in out.splitlines()
              if "restarting it in" in line]
    assert delays == [0.1, 0.2, 0.4], out                   # Docker's back-off: doubled after each quick exit
    assert out.count("crash  | crashing") == 4 and "restarted crash (pid" in out and ", restart 3)" in out
    assert out.rstrip().endswith("zmqflow up: crash exited with code 3"), out


def test_wait_fails_naming_the_service_that_failed(tmp_path):
    compose = write(tmp_path, """
services:
  broken:
    image: python:3.11-slim
    command: ["python", "-c", "import sys; sys.exit(5)"]
""")
    code, out = zmqflow("up", "-f", compose, "-d", "--wait")
    assert code == 1 and "broken exited with code 5" in out, out
    assert zmqflow("down", "-f", compose)[0] == 0


# ------------------------------------------------------------------ the shipped topology


def _answers(name, ports, keys):
    """Whether the serving service `name` answers now: a ZeroMQ ping (with the deployment's keys), or the
    gateway's readiness route; (bool, pid or None)."""
    if name == "gateway":
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2/health/ready", timeout=1).status == 200, None
        except OSError:
            return False, None
    from zmqflow.common.rpc.probe import probe
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ZMQFLOW_CURVE_DIR", keys)
        env.setenv("ZMQFLOW_CURVE_KEY", "serving")
        answer = probe(f"tcp://127.0.0.1:{ports[0]}", timeout=0.5)
    return answer.up, (answer.info or {}).get("pid") if answer.up else None


@pytest.mark.faults
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_each_killed_serving_service_answers_again_under_load(project, tmp_path):
    """The shipped file detached (`up -d --wait`: trained, then serving): under a client's load through the
    gateway, SIGKILL each serving service in turn; its restart policy starts it again, and the gap from the kill
    until it answers again is measured (printed) and bounded; the client's requests get answers again after
    each. `zmqflow down` then leaves no process."""
    offset = free_port_offset(compose_ports(project))
    env = {"EPOCHS": "1", "CHECKPOINT_EVERY_STEPS": "50"}
    workdir = tmp_path / "project"
    args = ["-f", COMPOSE, "--workdir", str(workdir)]
    code, out = zmqflow("up", *args, "--port-offset", str(offset), "-d", "--wait", "--wait-secs", "240",
                        timeout=300, env=env)
    state = json.loads((workdir / "state.json").read_text()) if (workdir / "state.json").exists() else {}
    pids = []
    try:
        assert code == 0, out + "".join((workdir / "logs" / f).read_text()[-2000:] for f in os.listdir(workdir / "logs"))
        keys = str(workdir / "zmqflow-keys")
        x = np.random.default_rng(0).random((2, 784), dtype=np.float32)
        body = json.dumps({"inputs": [{"name": "input", "shape": [2, 784], "datatype": "FP32",
                                       "data": x.ravel().tolist()}]}).encode()
        gateway = f"http://127.0.0.1:{8000 + offset}/v2/models/ensemble/infer"
        answered, failed, stop = [], [], threading.Event()

        def load():          # the client: a request every 20 ms through the gateway, the ensemble's way in
            while not stop.is_set():
                request = urllib.request.Request(gateway, body, {"Content-Type": "application/json",
                                                                 "X-Zmqflow-Deadline-Ms": "1000"})
                try:
                    urllib.request.urlopen(request, timeout=2).read()
                    answered.append(time.monotonic())
                except (OSError, http.client.HTTPException):   # refused, reset, or cut mid-answer by the kill
                    failed.append(time.monotonic())
                stop.wait(0.02)
        client = threading.Thread(target=load, daemon=True)
        client.start()
        gaps = {}
        try:
            for name in SERVING:
                row = ps(COMPOSE, "--workdir", str(workdir))[name]
                pids.append(row["pid"])
                wait_for(lambda: _answers(name, row["ports"], keys)[0], 15, f"{name} to answer before its kill",
                         interval=0.1)   # each probe waits 0.5-1 s: on a busy machine one can be late
                killed = time.monotonic()
                os.kill(row["pid"], signal.SIGKILL)
                deadline = killed + 30
                while True:
                    up_again, pid = _answers(name, row["ports"], keys)
                    if up_again and pid != row["pid"] and (name == "gateway" or pid is not None):
                        break
                    assert time.monotonic() < deadline, f"{name} did not answer within 30 s of its kill"
                    time.sleep(0.05)
                gaps[name] = time.monotonic() - killed
                wait_for(lambda: answered and answered[-1] > killed + gaps[name], 15,
                         f"the client's requests to be answered again after {name}'s restart", interval=0.1)
        finally:
            stop.set()
            client.join(5)
        print("\nzmqflow up, SIGKILL under load -> answering again: "
              + ", ".join(f"{name} {gap:.2f} s" for name, gap in gaps.items())
              + f" ({len(answered)} requests answered, {len(failed)} failed during the kills)")
        assert all(gap < 20 for gap in gaps.values()), gaps
        rows = ps(COMPOSE, "--workdir", str(workdir), "-a")
        assert all(rows[name]["restarts"] == 1 and rows[name]["state"] == "running" for name in SERVING), rows
        assert all(rows[name]["restarts"] == 0 and rows[name]["state"] == "exited (0)"
                   for name in ("data", "broker", "ps0", "ps1", "reader", "worker0", "worker1")), rows
        pids += [row["pid"] for row in rows.values() if row["pid"]]
    finally:
        code, out = zmqflow("down", *args, timeout=120)
    assert code == 0 and "stopped aggregator" in out, out
    assert all(gone(pid) for pid in pids + [state.get("supervisor", {}).get("pid")] if pid)


def test_wait_takes_a_service_that_finished_before_its_healthcheck_passed_for_done(tmp_path):
    """A reader whose epochs took a fraction of a second exits 0 before its healthcheck ever passed: done, as a
    one-shot, not unhealthy (the shipped topology's reader did this under load); a dependent that needs it
    healthy still cannot start."""
    compose = write(tmp_path, """
services:
  quick:
    image: python:3.11-slim
    command: ["python", "-c", "print('done')"]
    healthcheck: {test: ["CMD", "false"], interval: 1s}
  long:
    image: python:3.11-slim
    command: ["python", "-c", "import time; time.sleep(120)"]
""")
    code, out = zmqflow("up", "-f", compose, "-d", "--wait")
    try:
        assert code == 0 and "every service is running and healthy" in out, out
    finally:
        assert zmqflow("down", "-f", compose, "--timeout", "2")[0] == 0
    with open(compose, "a") as f:
        f.write("""  needs:
    image: python:3.11-slim
    command: ["python", "-c", "print('must not run')"]
    depends_on: {quick: {condition: service_healthy}}
""")
    code, out = up(["-f", compose, "--no-color"])
    assert code == 1 and "needs cannot start: quick is exited (it finished (exit 0) before its healthcheck passed)" \
        in out and "must not run" not in out, out
