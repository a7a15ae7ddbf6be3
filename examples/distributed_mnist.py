"""The seeds' distributed MNIST script, written against zmqflow's Python API: one process per task.

By hand, in four terminals (1 ps + 2 workers + nothing else; the chief shuts the ps down at the end):

    python examples/distributed_mnist.py --job_name ps --task_index 0 --ps_hosts 127.0.0.1:2222 \\
        --worker_hosts 127.0.0.1:2223,127.0.0.1:2224
    python examples/distributed_mnist.py --job_name worker --task_index 0 ...   (the same hosts)
    python examples/distributed_mnist.py --job_name worker --task_index 1 ...

or, as Kubeflow's TFJob starts each task, with no flags and TF_CONFIG naming the cluster and the task
(a "chief" job is worker 0, the worker job's tasks follow it):

    TF_CONFIG='{"cluster": {"ps": ["127.0.0.1:2222"], "chief": ["127.0.0.1:2223"], "worker": ["127.0.0.1:2224"]},
                "task": {"type": "chief", "index": 0}}' python examples/distributed_mnist.py

or all of them from one command (free ports chosen): python examples/distributed_mnist.py
Each worker draws its own batches from the shipped MNIST sample (as `mnist.train.next_batch`); the
chief prints the test accuracy when training stops.
"""

import argparse
import os
import subprocess
import sys

import numpy as np

import zmqflow
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.inputs.datasets import mnist_split


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job_name", choices=["ps", "worker"])
    parser.add_argument("--task_index", type=int, default=0)
    parser.add_argument("--ps_hosts", default=None, help="host:port,... (default with --local: free loopback ports)")
    parser.add_argument("--worker_hosts", default=None, help="host:port,... (default with --local: two workers)")
    parser.add_argument("--train_steps", type=int, default=1000, help="Global steps to train (StopAtStepHook).")
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--local", action="store_true", help="Start every task of the cluster as a process here.")
    return parser.parse_args(argv)


def main(argv=None):
    flags = parse(argv)
    from_env = flags.job_name is None and not flags.local and os.environ.get("TF_CONFIG", "").strip() not in ("", "{}")
    if not from_env and (flags.local or flags.job_name is None):     # no task named: the whole cluster here
        return run_locally(flags)
    try:
        server = server_from_tf_config() if from_env else server_from_flags(flags)
    except InvalidArgumentError as e:
        raise SystemExit(f"distributed_mnist: {e}") from None
    if server.job_name == "ps":
        server.join()
        return 0
    (train_x, train_y), (test_x, test_y) = mnist_split()
    rng = np.random.default_rng(server.replica)
    is_chief = server.is_chief
    with zmqflow.MonitoredTrainingSession(server, is_chief=is_chief,
                                          hooks=[zmqflow.StopAtStepHook(last_step=flags.train_steps)]) as sess:
        while not sess.should_stop():
            batch = rng.integers(0, len(train_y), flags.batch_size)      # mnist.train.next_batch
            sess.run(train_x[batch], train_y[batch])
        if is_chief:
            accuracy = sess.evaluate(test_x, test_y)
    if is_chief:
        print(f"distributed_mnist: test accuracy {accuracy:.4f} at global step {sess.global_step}")
        return 0 if accuracy > 0.85 else 1
    return 0


def server_from_flags(flags):
    if not flags.ps_hosts or not flags.worker_hosts:
        raise SystemExit("--ps_hosts and --worker_hosts name the cluster's tasks (or set TF_CONFIG)")
    cluster = zmqflow.ClusterSpec({"ps": flags.ps_hosts.split(","), "worker": flags.worker_hosts.split(",")})
    return zmqflow.Server(cluster, job_name=flags.job_name, task_index=flags.task_index, model="mlp")


def server_from_tf_config():
    """This task as TF_CONFIG names it: {"cluster": {...}, "task": {"type": ..., "index": ...}}."""
    return zmqflow.Server.from_tf_config(model="mlp")


def run_locally(flags):
    """The ps first, then the workers, each a process of this script; every process waited for."""
    flags.ps_hosts = flags.ps_hosts or free_addresses(1)
    flags.worker_hosts = flags.worker_hosts or free_addresses(2)
    common = ["--ps_hosts", flags.ps_hosts, "--worker_hosts", flags.worker_hosts, "--train_steps",
              str(flags.train_steps)]
    tasks = [("ps", i) for i in range(len(flags.ps_hosts.split(",")))]
    tasks += [("worker", i) for i in range(len(flags.worker_hosts.split(",")))]
    procs = [subprocess.Popen([sys.executable, __file__, "--job_name", job, "--task_index", str(i), *common])
             for job, i in tasks]
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return 0 if codes == [0] * len(codes) else 1


def free_addresses(n):
    """n loopback addresses whose ports were free just now."""
    import socket
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return ",".join(f"127.0.0.1:{port}" for port in ports)


if __name__ == "__main__":
    raise SystemExit(main())
