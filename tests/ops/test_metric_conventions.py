"""Every service's metrics follow Prometheus' conventions, scraped from real processes: counters and
histograms for anything that accumulates (no rate computed by a task), gauges only for states in
STATE_GAUGES, base units in names, a `task` label on every zmqflow_* sample; docs/metrics.md lists
exactly what the tasks export, and the Grafana dashboard in deploy/ queries only those names."""

import importlib.util
import json
import re
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.clients.queues import FIFOQueue
from zmqflow.inputs.datasets import mnist_split
from zmqflow.models.spec import MNIST_MLP
from zmqflow.services.worker.validation import validation_families
from tests.ops.helpers import json_lines, metrics_url, scrape_text
from tests.ops.metric_names import documented_metrics
from tests.support import free_port, wait_for

pytestmark = pytest.mark.integration

OPS = ["--metrics-bind", "0", "--log-format", "json"]

STATE_GAUGES = {
    "zmqflow_task_info": "an info metric: 1, with the task and service as labels",
    "zmqflow_rpc_parked_requests": "requests parked now; they leave as they are answered",
    "zmqflow_rpc_connections": "connections open now; they leave as their peers disconnect",
    "zmqflow_broker_queues": "queues held now; reset frees them",
    "zmqflow_broker_held_bytes": "bytes held now; dequeues free them",
    "zmqflow_broker_queue_size": "elements in a queue now",
    "zmqflow_broker_queue_capacity": "a setting of the queue",
    "zmqflow_broker_queue_bytes": "bytes a queue holds now",
    "zmqflow_broker_queue_leased": "elements out on leases now; acks and returns settle them",
    "zmqflow_broker_queue_closed": "a state: 0 open, 1 closed",
    "zmqflow_broker_waiting_enqueues": "enqueues parked now",
    "zmqflow_broker_waiting_dequeues": "dequeues parked now",
    "zmqflow_broker_open_leases": "leases not settled now",
    "zmqflow_ps_version": "the current global step, a position rather than a count of events",
    "zmqflow_ps_pushes_pending": "sync pushes accumulated for the current step; emptied at each step",
    "zmqflow_ps_done_workers": "workers done now; a rejoining worker leaves the set",
    "zmqflow_ps_replica_last_push_timestamp_seconds": "a Unix timestamp: time() minus it is the idle time",
    "zmqflow_worker_global_step": "the global step last seen, a position",
    "zmqflow_worker_loss": "the last step's loss, a sampled value",
    "zmqflow_validation_metric": "the last validation's value, a sampled value",
    "zmqflow_validation_global_step": "the global step of the last validation, a position",
    "zmqflow_reader_files_reading": "files open now",
    "zmqflow_serve_model_version": "the version served now",
    "zmqflow_serve_queued_rows": "requests waiting for a batch now",
    "zmqflow_aggregator_member_healthy": "a state: 1 healthy, 0 not",
    "zmqflow_aggregator_member_outstanding": "requests in flight to a member now",
}
NOT_BASE_UNITS = re.compile(r"_(ms|msec|millis|milliseconds|us|micros|minutes|hours|per_second|per_sec|per_s|rate|"
                            r"kb|mb|gb|kib|mib|gib|percent)(_|$)")
HISTOGRAM_UNITS = ("_seconds", "_bytes", "_steps")


def convention_problems(family):
    """What is wrong with one parsed family by the conventions of docs/metrics.md ([] when nothing)."""
    name, problems = family.name, []
    if family.type == "gauge" and name not in STATE_GAUGES:
        problems.append(f"{name}: a gauge, but not a state gauge (export a counter; rate() makes the rate)")
    if family.type not in ("counter", "histogram", "gauge"):
        problems.append(f"{name}: type {family.type}")
    if NOT_BASE_UNITS.search(name):
        problems.append(f"{name}: not in base units (seconds, bytes) or a precomputed rate")
    for unit in ("seconds", "bytes"):
        if f"_{unit}" in name and not name.endswith(f"_{unit}"):
            problems.append(f"{name}: the unit _{unit} goes last")
    if family.type == "histogram" and not name.endswith(HISTOGRAM_UNITS):
        problems.append(f"{name}: a histogram without its unit ({', '.join(HISTOGRAM_UNITS)})")
    for sample in family.samples:
        if family.type == "counter" and not sample.name.endswith(("_total", "_created")):
            problems.append(f"{sample.name}: a counter's sample not ending in _total")
        if not sample.labels.get("task"):
            problems.append(f"{sample.name}{sample.labels}: no task label")
    return problems


def scrape_families(url):
    return [f for f in text_string_to_metric_families(scrape_text(url)) if f.name.startswith("zmqflow_")]


def logged_metrics_url(proc):
    """The /metrics URL a worker or reader (no RPC to ask) logged at start."""
    started = wait_for(lambda: [e for e in json_lines(proc.log()) if e["message"].startswith("metrics on ")],
                       60, f"{proc.name}'s metrics endpoint")
    return started[0]["message"].split()[-1]


@pytest.fixture(scope="module")
def scraped(module_processes):
    """{task: its zmqflow_* families} of a broker, ps, training worker, reader, model server and aggregator,
    each after some traffic."""
    start = module_processes.service
    broker = start("zmqflow.services.broker", OPS)
    ps = start("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP), *OPS])
    (x, y), _ = mnist_split()
    FIFOQueue(500, ["float32", "int32"], shapes=[[784], []], names=["image", "label"], shared_name="train",
              broker=broker.endpoint).enqueue_many({"image": x[:200], "label": y[:200]})
    worker = module_processes.process("zmqflow.services.worker", ["--broker", broker.endpoint, "--ps", ps.endpoint,
                                                                  "--backend", "numpy", *OPS], name="chief")
    reader = module_processes.process("zmqflow.services.reader", ["--broker", broker.endpoint, "--preset", "mnist-csv",
                                                                  "--queue", "instances", "--capacity", "20", "--chunk-size", "10",
                                                                  "--num-epochs", "0", *OPS], name="reader")
    worker_url, reader_url = logged_metrics_url(worker), logged_metrics_url(reader)
    wait_for(lambda: _sample(scrape_families(worker_url), "zmqflow_worker_steps_total") >= 2, 60, "2 training steps")
    server = start("zmqflow.services.serve", ["--ps", ps.endpoint, "--backend", "numpy", *OPS])
    aggregator = start("zmqflow.services.aggregator", ["--member", server.endpoint, *OPS])
    with AggregatorClient(aggregator.endpoint, timeout=10.0) as client:
        client.predict(np.zeros((2, 784), np.float32))
    wait_for(lambda: _sample(scrape_families(reader_url), "zmqflow_reader_instances_total") > 0, 30,
             "the reader's first instances")
    urls = {"broker": metrics_url(broker.endpoint), "ps": metrics_url(ps.endpoint), "worker": worker_url,
            "reader": reader_url, "serve": metrics_url(server.endpoint), "aggregator": metrics_url(aggregator.endpoint)}
    if importlib.util.find_spec("starlette") is not None:   # the gateway (the http extra), after one infer request
        grpc_address = f"127.0.0.1:{free_port()}"            # and one gRPC ModelInfer (the grpc extra)
        gateway = module_processes.process("zmqflow.services.gateway", ["--aggregator", aggregator.endpoint, "--bind",
                                                                        "127.0.0.1:0", "--grpc-bind", grpc_address,
                                                                        *OPS], name="gateway")
        listening = wait_for(lambda: [e for e in json_lines(gateway.log()) if "gateway listening on" in e["message"]],
                             60, "the gateway's address")
        http = listening[0]["message"].split("gateway listening on ")[1].split()[0]
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": [0.0] * 784}]})
        request = urllib.request.Request(f"{http}/v2/models/ensemble/infer", body.encode(),
                                         {"Content-Type": "application/json"})
        wait_for(lambda: _answers(request), 30, "the gateway's first infer answer")
        import tritonclient.grpc as grpcclient
        with grpcclient.InferenceServerClient(grpc_address) as client:
            data = grpcclient.InferInput("input", [1, 784], "FP32")
            data.set_data_from_numpy(np.zeros((1, 784), np.float32))
            client.infer("ensemble", [data], client_timeout=10)
        urls["gateway"] = logged_metrics_url(gateway)
    return {task: scrape_families(url) for task, url in urls.items()}


def _answers(request):
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False   # not ready yet (503) or not listening yet


def _sample(families, name):
    return sum(s.value for f in families for s in f.samples if s.name == name)


def test_every_service_exports_counters_histograms_and_state_gauges_in_base_units(scraped):
    problems = [p for families in scraped.values() for f in families for p in convention_problems(f)]
    problems += [p for f in validation_families([{"step": 3, "accuracy": 0.5}]) for p in convention_problems(f)
                 if "no task label" not in p]   # the chief's, labelled by the collector like the others
    assert not problems, "\n".join(problems)
    types = {f.type for families in scraped.values() for f in families}
    print({task: len(families) for task, families in scraped.items()}, "families per task")
    assert {"counter", "histogram", "gauge"} <= types


def test_one_task_label_per_process_naming_it(scraped):
    tasks = {service: {s.labels["task"] for f in families for s in f.samples} for service, families in scraped.items()}
    assert tasks["broker"] == {"broker:0"} and tasks["ps"] == {"ps:0"} and tasks["worker"] == {"worker:0"}
    assert all(len(names) == 1 for names in tasks.values()), tasks
    info = {service: {(s.labels["task"], s.labels["service"]) for f in families if f.name == "zmqflow_task_info"
                      for s in f.samples} for service, families in scraped.items()}
    assert info["worker"] == {("worker:0", "worker")} and info["reader"] == {(*tasks["reader"], "reader")}
    assert info["aggregator"] == {(*tasks["aggregator"], "aggregator")}   # what the dashboard's task list reads


def test_docs_list_exactly_what_the_tasks_export_and_every_state_gauge_is_exported(scraped):
    exported = {f.name for families in scraped.values() for f in families}
    exported |= {f.name for f in validation_families([{"step": 3, "accuracy": 0.5}])}
    assert set(STATE_GAUGES) <= exported, set(STATE_GAUGES) - exported
    kinds = {f.name: f.type for families in scraped.values() for f in families}
    kinds.update((f.name, f.type) for f in validation_families([{"step": 3, "accuracy": 0.5}]))
    documented = documented_metrics()
    assert documented == kinds, {"undocumented": exported - set(documented), "not exported": set(documented) - exported,
                                 "kind": {n: (k, kinds[n]) for n, k in documented.items() if kinds.get(n, k) != k}}
