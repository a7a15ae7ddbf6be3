"""The supervising process of a `zmqflow up` run, in the foreground or detached (`zmqflow up -d`).

`supervise` runs what the project folder's run.json says (jobs/up/state.py) with a Runner and keeps
state.json current, so `zmqflow compose ps`, `zmqflow logs` and `zmqflow down` work from any shell.
`zmqflow up -d` starts `python -m zmqflow.jobs.up.detached WORKDIR` in a session of its own (it outlives
the shell), its own messages in up.log; `start_detached` starts it and waits until it has written its state.
"""

import os
import subprocess
import sys
import time

from zmqflow.jobs.up.logs import Prefixer
from zmqflow.jobs.up.runner import Runner
from zmqflow.jobs.up.state import ProjectFolder, StateWriter, services_from_json, supervisor_alive


def supervise(folder, out, color=False, detached=False):
    """Run folder's run.json to its end; its exit code (runner.py's rules)."""
    run = folder.run()
    services = services_from_json(run["services"])
    prefixer = Prefixer(run["names"], out, color, log_dir=folder.log_dir)
    writer = StateWriter(folder, run["compose_file"], detached)
    runner = Runner(services, prefixer, run["cwd"], run["exit_code_from"], run["abort_on_failure"],
                    run["stop_timeout"], run["health_timeout"], on_change=writer)
    writer(runner)
    code = runner.run()
    writer(runner, ended={"exit_code": code, "at": time.time()})
    return code


def start_detached(folder, limit=20.0):
    """Start the detached supervisor of folder's run; its pid once it has written state.json, or RuntimeError
    with the tail of its log when it exits first or does not start within `limit` seconds."""
    with open(folder.up_log, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "zmqflow.jobs.up.detached", folder.workdir],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=folder.run()["cwd"], start_new_session=True)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        state = folder.state()
        if state and state["supervisor"]["pid"] == proc.pid and supervisor_alive(state):
            return proc.pid
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    if proc.poll() is None:
        proc.terminate()
    with open(folder.up_log, errors="replace") as f:
        tail = "".join(f.readlines()[-20:])
    raise RuntimeError(f"the detached run did not start (its log {folder.up_log}):\n{tail}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.exit("usage: python -m zmqflow.jobs.up.detached WORKDIR (started by `zmqflow up -d`)")
    folder = ProjectFolder(argv[0])
    os.chdir(folder.run()["cwd"])
    sys.exit(supervise(folder, sys.stdout, detached=True))


if __name__ == "__main__":
    main()
