"""The seeds' simple_client.py on zmqflow: a variable one client creates and initialises, other clients
(other processes) increment, in a resource container that `Session.reset` frees.

All of it from one command (a ps task and two incrementing clients, each its own process, free ports):

    python examples/shared_variables.py

or by hand, as the texts run it, in three terminals:

    python examples/shared_variables.py --job_name ps --ps_hosts 127.0.0.1:2222      # serves until stopped
    python examples/shared_variables.py --client init --ps_hosts 127.0.0.1:2222      # var = 0.0, prints it
    python examples/shared_variables.py --client increment --ps_hosts 127.0.0.1:2222 # var += 1.0, 10 times

TensorFlow 1.x wrote it `with tf.container("experiment0"): var = tf.Variable(0.0)` then
`sess2.run(var.assign_add(1.0))` and `tf.Session.reset(target, ["experiment0"])`; here the variable is
named (every client names the same one) and lives on the ps task its name is placed on.
"""

import argparse
import socket
import subprocess
import sys
import time

import zmqflow
from zmqflow.common.errors import NotFoundError, OpError
from zmqflow.common.rpc.probe import probe

CONTAINER = "experiment0"


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job_name", choices=["ps"], help="Serve a ps task (until stopped).")
    parser.add_argument("--client", choices=["init", "increment", "read"], help="Be one client of the ps task.")
    parser.add_argument("--ps_hosts", default=None, help="host:port of the ps task (default: a free loopback port)")
    parser.add_argument("--times", type=int, default=10, help="How often an incrementing client adds 1.0.")
    parser.add_argument("--clients", type=int, default=2, help="Incrementing clients run together (one command).")
    return parser.parse_args(argv)


def main(argv=None):
    flags = parse(argv)
    if flags.job_name == "ps":
        return serve_ps(flags.ps_hosts)
    if flags.client:
        return run_client(flags.client, flags.ps_hosts, flags.times)
    return run_locally(flags)


def serve_ps(ps_host):
    """One ps task of a cluster whose clients are the worker tasks (they bind nothing here)."""
    cluster = zmqflow.ClusterSpec({"ps": [ps_host], "worker": [free_address()]})
    zmqflow.Server(cluster, job_name="ps", task_index=0).join()
    return 0


def run_client(role, ps_host, times):
    sess = zmqflow.Session(ps_host)
    with zmqflow.container(CONTAINER):
        if role == "init":           # created unless it exists: two clients may both run it
            var = sess.variable("var", initial_value=0.0)
        else:                        # it must exist: NotFoundError otherwise
            var = sess.variable("var")
    if role == "increment":
        for _ in range(times):
            var.assign_add(1.0, read_value=False)    # atomic on the ps: increments of all clients add up
    print(f"shared_variables: {role}: var = {float(var.read_value())}")
    return 0


def run_locally(flags):
    """The ps task, this process as the first client, then `--clients` incrementing clients at once."""
    ps_host = flags.ps_hosts or free_address()
    command = [sys.executable, __file__, "--ps_hosts", ps_host]
    ps = subprocess.Popen(command + ["--job_name", "ps"])
    try:
        wait_until_up(ps_host, ps)
        run_client("init", ps_host, 0)
        clients = [subprocess.Popen(command + ["--client", "increment", "--times", str(flags.times)])
                   for _ in range(flags.clients)]
        codes = [c.wait(timeout=120) for c in clients]
        if codes != [0] * len(codes):
            print(f"shared_variables: an incrementing client failed: exit codes {codes}", file=sys.stderr)
            return 1
        with zmqflow.container(CONTAINER):
            total = float(zmqflow.Session(ps_host).variable("var").read_value())
        expected = float(flags.clients * flags.times)
        print(f"shared_variables: {flags.clients} clients added 1.0 {flags.times} times each: var = {total}")
        freed = zmqflow.reset(ps_host, [CONTAINER])
        try:
            zmqflow.Session(ps_host).variable("var", container=CONTAINER)
            print("shared_variables: the variable outlived the reset of its container", file=sys.stderr)
            return 1
        except NotFoundError:
            print(f"shared_variables: reset {CONTAINER!r} freed {freed[CONTAINER]} variable(s); var is gone")
        return 0 if total == expected else 1
    except OpError as exc:
        print(f"shared_variables: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        ps.terminate()
        try:
            ps.wait(timeout=10)
        except subprocess.TimeoutExpired:
            ps.kill()


def wait_until_up(address, process, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not probe(address, timeout=1.0).up:
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"shared_variables: the ps task at {address} did not start")
        time.sleep(0.1)


def free_address():
    """A loopback address whose port was free just now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


if __name__ == "__main__":
    raise SystemExit(main())
