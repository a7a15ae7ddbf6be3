"""The reference topology (docker-compose.yml) on hosts of their own: nothing in zmqflow needs loopback.

Every task runs in a Linux network namespace of its own (tests/support/netns.py): the broker, two
ps shards, two workers (worker 0 is the chief), a reader, a model server, an aggregator and a
client, each with its own 10.77.x.y address, joined by one bridge over veth links shaped to 1gbit
(htb). The cluster is the TF_CONFIG of the compose file with those addresses; both ps shards listen
on the same port, as two machines would. Training runs one epoch and ends the way the compose job
does (the chief checkpoints, evaluates, shuts the ps shards and the broker down, everything exits
0); then the model server serves that checkpoint, the aggregator fronts it, and the client gets
predictions with no failure, as accurate as the chief said. Needs root: it skips with the reason
otherwise (`make test-netns`).
"""

import json
import os
import sys
import time
from types import SimpleNamespace

import pytest

from zmqflow.common.checkpoints import checkpoint
from tests.support import wait_for
from tests.support.netns import ZMQFLOW, NetworkNamespaces, skip_unless_usable

pytestmark = [pytest.mark.integration, pytest.mark.netns]

HOSTS = ["broker", "ps0", "ps1", "worker0", "worker1", "reader", "serve", "aggregator", "client"]
RATE = "1gbit"
BROKER_PORT, PS_PORT, WORKER_PORT, SERVE_PORT, AGGREGATOR_PORT = 5555, 5600, 5610, 5700, 5800
OPTIMIZER = '{"kind": "adam", "learning_rate": 0.004}'
EPOCHS = 1
READY_S, TRAIN_S, EXIT_S = 30, 90, 20

# the services listen beyond loopback without CURVE (protected mode refuses that unless told): only these
# namespaces reach them
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "ZMQFLOW_INSECURE": "1"}


@pytest.fixture(scope="module")
def network():
    skip_unless_usable()
    with NetworkNamespaces(HOSTS, rate=RATE) as hosts:
        yield hosts
    assert not hosts.leftovers(), f"left behind: {hosts.leftovers()}"


def start(registry, hosts, host, name, argv, log_dir, env=None):
    """argv (a zmqflow subcommand) in the host's namespace, owned by the registry (stopped by group)."""
    return registry.start(name, hosts.run(host, [ZMQFLOW, *argv]), env={**ENV, **(env or {})},
                          log_path=os.path.join(log_dir, f"{name}.log"))


def start_service(registry, hosts, host, name, argv, log_dir, env=None):
    """A service with --ready-file: returns once it serves, or fails with its log."""
    ready = os.path.join(log_dir, f"{name}.ready")
    child = start(registry, hosts, host, name, [*argv, "--ready-file", ready], log_dir, env)
    wait_for(lambda: os.path.exists(ready) or not child.alive(), READY_S, f"{name} to serve")
    assert child.alive(), f"{name} exited with {child.returncode} before serving:\n{child.log()[-3000:]}"
    return child


def zmqflow_ping(hosts, host, address, timeout=1.0):
    """`zmqflow ping` run in the host's namespace: its exit code."""
    return hosts.execute(host, [ZMQFLOW, "ping", "--timeout-secs", str(timeout), "--address", address], timeout=30).returncode


def tf_config(hosts, task_type, index):
    cluster = {"ps": [f"{hosts.address('ps0')}:{PS_PORT}", f"{hosts.address('ps1')}:{PS_PORT}"],
               "worker": [f"{hosts.address('worker0')}:{WORKER_PORT}", f"{hosts.address('worker1')}:{WORKER_PORT}"],
               "broker": [f"{hosts.address('broker')}:{BROKER_PORT}"]}
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def wait_exit(child, timeout, everyone):
    """Wait (bounded) for the child to exit; on timeout the error ends with every log's tail."""
    try:
        wait_for(lambda: not child.alive(), max(0.1, timeout), f"{child.name} to exit")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{tails(everyone)}") from None


def tails(children):
    return "\n".join(f"--- {c.name} (exit {c.returncode}):\n{c.log()[-2000:]}" for c in children)


@pytest.fixture(scope="module")
def training(network, module_processes, tmp_path_factory):
    """The compose job's training half across the namespaces, run once: its processes, codes and result."""
    root = tmp_path_factory.mktemp("netns-job")
    data, ckpt, logs = (str(root / d) for d in ("mnist", "ckpt", "logs"))
    os.makedirs(ckpt)
    os.makedirs(logs)
    wrote = network.execute("reader", [ZMQFLOW, "data", "mnist-shards", "--out", data], timeout=120)
    assert wrote.returncode == 0, wrote.stdout + wrote.stderr
    broker = f"tcp://{network.address('broker')}:{BROKER_PORT}"
    started = time.monotonic()
    run = {"broker": start_service(module_processes, network, "broker", "broker",
                                   ["broker", "--bind", f"tcp://0.0.0.0:{BROKER_PORT}"], logs)}
    for i in range(2):
        run[f"ps{i}"] = start_service(module_processes, network, f"ps{i}", f"ps{i}",
                                      ["ps", "--optimizer", OPTIMIZER, "--restore-from", ckpt], logs,
                                      env={"TF_CONFIG": tf_config(network, "ps", i)})
    run["reader"] = start(module_processes, network, "reader", "reader",
                          ["reader", "--broker", broker, "--preset", "mnist-shards", "--files", f"{data}/*.bin",
                           "--queue", "train", "--num-epochs", str(EPOCHS), "--capacity", "20000",
                           "--min-after-dequeue", "2000", "--seed", "0"], logs)
    for i in range(2):
        run[f"worker{i}"] = start(module_processes, network, f"worker{i}", f"worker{i}",
                                  ["worker", "--broker", broker, "--queue", "train", "--evaluate", "--shutdown-ps",
                                   "--shutdown-broker", "--checkpoint-dir", ckpt, "--checkpoint-every-steps", "20",
                                   "--json-out", os.path.join(logs, f"worker{i}.json")],
                                  logs, env={"TF_CONFIG": tf_config(network, "worker", i)})
    wait_exit(run["worker0"], TRAIN_S, run.values())
    deadline = time.monotonic() + EXIT_S
    for child in run.values():
        wait_exit(child, deadline - time.monotonic(), run.values())
    result_file = os.path.join(logs, "worker0.json")
    result = None
    if os.path.exists(result_file):
        with open(result_file) as f:
            result = json.load(f)
    return SimpleNamespace(children=run, codes={name: c.returncode for name, c in run.items()}, result=result,
                           checkpoint_dir=ckpt, seconds=time.monotonic() - started)


def test_every_task_has_its_own_host_address_and_a_shaped_link(network, processes, tmp_path):
    for host in HOSTS:
        ns = network.namespace(host)
        addresses = network.execute(host, ["ip", "-4", "-o", "addr", "show", "dev", "eth0"]).stdout
        assert f"inet {network.address(host)}/{network.subnet.prefixlen}" in addresses, (host, addresses)
        qdisc = network.execute(host, ["tc", "qdisc", "show", "dev", "eth0"]).stdout
        assert "qdisc htb 1: root" in qdisc, (ns, qdisc)
        classes = network.execute(host, ["tc", "class", "show", "dev", "eth0"]).stdout
        assert "rate 1Gbit" in classes, (ns, classes)
    assert len(set(network.addresses.values())) == len(HOSTS)

    # A broker in its namespace: the others reach it at its address only; 127.0.0.1 is each host's own.
    start_service(processes, network, "broker", "probe-broker", ["broker", "--bind", f"tcp://0.0.0.0:{BROKER_PORT}"],
                  str(tmp_path))
    assert zmqflow_ping(network, "broker", f"tcp://127.0.0.1:{BROKER_PORT}") == 0
    assert zmqflow_ping(network, "ps0", f"tcp://{network.address('broker')}:{BROKER_PORT}") == 0
    assert zmqflow_ping(network, "ps0", f"tcp://127.0.0.1:{BROKER_PORT}") == 1, "ps0's loopback reached the broker"
    assert zmqflow_ping(network, "client", f"tcp://127.0.0.1:{BROKER_PORT}") == 1


def test_training_across_hosts_checkpoints_reports_accuracy_and_every_task_exits_0(network, training):
    assert training.codes == {name: 0 for name in training.codes}, tails(training.children.values())
    assert checkpoint.latest_checkpoint(training.checkpoint_dir), os.listdir(training.checkpoint_dir)
    assert training.result, "the chief wrote no result file"
    assert 0.5 <= training.result["test_accuracy"] <= 1.0, training.result  # one epoch; chance is 0.1
    # The traffic went through the shaped links: the broker's htb class carried the mini-batches.
    stats = network.execute("broker", ["tc", "-s", "class", "show", "dev", "eth0"]).stdout
    sent = int(stats.split("Sent ", 1)[1].split()[0])
    assert sent > 4500 * 784, stats  # every training example left the broker at least once (as float32 or bytes)
    print(f"\ntraining: {training.seconds:.1f} s, chief result {training.result}, broker link sent {sent} bytes")


def test_serving_across_hosts_answers_every_request_from_the_checkpoint(network, training, processes, tmp_path):
    assert checkpoint.latest_checkpoint(training.checkpoint_dir), "training across the hosts wrote no checkpoint"
    assert training.result, "the chief wrote no result file (its test accuracy is compared below)"
    logs = str(tmp_path)
    start_service(processes, network, "serve", "serve",
                  ["serve", "--checkpoint", training.checkpoint_dir, "--bind", f"tcp://0.0.0.0:{SERVE_PORT}",
                   "--refresh-secs", "5", "--model-name", "mnist"], logs)
    start_service(processes, network, "aggregator", "aggregator",
                  ["aggregator", "--bind", f"tcp://0.0.0.0:{AGGREGATOR_PORT}", "--mode", "replica",
                   "--member", f"tcp://{network.address('serve')}:{SERVE_PORT}", "--deadline-ms", "1000",
                   "--min-members", "1"], logs)
    aggregator = f"tcp://{network.address('aggregator')}:{AGGREGATOR_PORT}"

    report_file = os.path.join(logs, "loadtest.json")
    load = network.execute("client", [ZMQFLOW, "loadtest", "--address", aggregator, "--rate", "100", "--duration-secs", "3",
                                      "--deadline-ms", "1000", "--max-failures", "0", "--json-out", report_file],
                           timeout=60)
    assert load.returncode == 0, load.stdout + load.stderr
    with open(report_file) as f:
        overall = json.load(f)["overall"]
    assert overall["failed"] == 0 and overall["answered"] == overall["requests"] == 300, overall

    # The test split through the aggregator: the served model is the chief's (same accuracy).
    script = ("import json, sys\n"
              "from zmqflow.common.clients.aggregator import AggregatorClient\n"
              "from zmqflow.inputs.datasets import mnist_split\n"
              "_, (x, y) = mnist_split()\n"
              "with AggregatorClient(sys.argv[1], timeout=20) as client:\n"
              "    p, info = client.predict(x, deadline_ms=10000)\n"
              "print(json.dumps({'rows': len(y), 'accuracy': float((p.argmax(1) == y).mean())}))\n")
    predicted = network.execute("client", [sys.executable, "-c", script, aggregator], timeout=60)
    assert predicted.returncode == 0, predicted.stdout + predicted.stderr
    answer = json.loads(predicted.stdout.strip().splitlines()[-1])
    assert answer["rows"] == 500
    assert abs(answer["accuracy"] - training.result["test_accuracy"]) <= 0.01, (answer, training.result)
    print(f"\nserving: loadtest {overall}, test split through the aggregator {answer}")
