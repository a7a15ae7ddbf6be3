"""docker-compose.yml from a JobSpec: `zmqflow compose render` writes the shipped file from jobs/spec.py's DEPLOYMENT.

The services are the job's tasks (`tasks(spec, deployment(spec))`: keys, data, broker, ps shards, reader,
workers, model servers, aggregator, gateway) with what Compose adds around them: the shared block every
service takes (`<<: *zmqflow`), the order they start in (depends_on), their healthchecks, the restart
policy of the serving ones (`unless-stopped`: SERVING; the training tasks end, and stay ended), the ports
published on the host's loopback, and the dashboard (on every task). A few values stay variables of the
file (EPOCHS, ZMQFLOW_DATA, ...; VARIABLES), their defaults the spec's. The rest of the file, its header,
shared blocks and load tests, is the template docker-compose.yml.in as it is. Only keys that both
Compose v2 and docker-compose 1.29 accept (no healthcheck start_interval: deploy/compose-v2.yml).
"""

import json
import os
import textwrap

from zmqflow.common.rpc.encryption import KEY_ENV
from zmqflow.jobs.spec import (AGGREGATOR_PORT, BROKER_PORT, DEPLOYMENT, GATEWAY_GRPC_PORT, GATEWAY_PORT,
                               METRICS_OFFSET, PS_PORT, SERVE_PORT, WORKER_PORT, deployment, tasks)

VARIABLES = {("reader", "num-epochs"): "EPOCHS", ("worker", "checkpoint-every-steps"): "CHECKPOINT_EVERY_STEPS",
             ("data", "data"): "ZMQFLOW_DATA", ("data", "model"): "ZMQFLOW_MODEL", ("serve", "model-name"): "ZMQFLOW_NAME"}
"""(role, option) -> the variable of the compose file that sets it (its default: the spec's value)."""

DASHBOARD_PORT = 8088
COMPLETED, HEALTHY = "service_completed_successfully", "service_healthy"
SERVING = ("serve", "aggregator", "gateway")   # restart: unless-stopped (docker compose and zmqflow up)
TEMPLATE = os.path.join(os.path.dirname(__file__), "docker-compose.yml.in")   # the file's fixed text

COMMENTS = {
    "keys": "one-shot: the deployment's CURVE keys, made on the first run and kept (--keep) on the next ones",
    "data": "one-shot: the train split only (the chief evaluates on the test rows), rewritten on every run",
    "gateway": "the Open Inference Protocol over HTTP (curl, tritonclient.http, KServe's clients) and gRPC "
               "(tritonclient.grpc)\n# in front of the aggregator; over ZeroMQ it is the aggregator's client (CURVE "
               "with the deployment's keys, like\n# every service here).",
}


def render(spec=DEPLOYMENT):
    """The compose file's text for `spec`."""
    placement = deployment(spec)
    job = {task.name if task.role != "reader" or spec.cluster.readers > 1 else "reader": task
           for task in tasks(spec, placement)}
    ps = [n for n, t in job.items() if t.role == "ps"]
    workers = [n for n, t in job.items() if t.role == "worker"]
    serves = [n for n, t in job.items() if t.role == "serve"]
    metrics = ", ".join(f"{name} {t.ports['metrics']}" for name, t in job.items() if "metrics" in t.ports)
    cluster = "   ".join(f"{role}: " + ", ".join(addresses) for role, addresses in placement.cluster.items())
    fields = dict(ps_names=", ".join(ps), worker_names=", ".join(workers), aggregator=AGGREGATOR_PORT,
                  gateway=GATEWAY_PORT, gateway_grpc=GATEWAY_GRPC_PORT, data=spec.data, model=spec.model,
                  name=spec.serving.name,
                  epochs=spec.training.epochs, every=spec.checkpoint.every_steps, tf_names=", ".join(ps + workers),
                  cluster=cluster, prepared=placement.prepared,
                  serve_names=f"{serves[0]}..{serves[-1][len('serve'):]}" if serves else "(none)",
                  metrics=textwrap.fill(f"Prometheus metrics: http://SERVICE:<its port + 1000>/metrics ({metrics}).",
                                        116, initial_indent="# ", subsequent_indent="# "))
    services = []
    keys = {"keys": COMPLETED}
    for name, task in job.items():
        role, depends = task.role, dict(keys)
        health, expose = None, [task.ports[p] for p in ("zmq", "http", "grpc") if p in task.ports]
        if "metrics" in task.ports:
            expose.append(task.ports["metrics"])
        if role in ("broker", "ps", "serve", "aggregator"):
            health = ("health", ["CMD", "zmqflow", "ping", "--address", f"tcp://127.0.0.1:{task.ports['zmq']}"])
        if role == "keys":
            depends = {}
        elif role == "ps":
            depends["data"] = COMPLETED                                    # the fitted model
        elif role == "reader":
            depends.update({"data": COMPLETED, "broker": HEALTHY})
            health = ("health_watch", ["CMD-SHELL", f"zmqflow queues --address tcp://broker:{BROKER_PORT} | grep -q "
                                                    f"{spec.input.queue}"])
        elif role == "worker":
            depends.update({"broker": HEALTHY, **{p: HEALTHY for p in ps}})
            health = ("health_watch", ["CMD", "zmqflow", "cluster", "check"])   # every server of its TF_CONFIG answers
        elif role == "serve":
            depends[workers[0]] = COMPLETED                                # the chief's final checkpoint
        elif role == "aggregator":
            depends.update({s: HEALTHY for s in serves})
        elif role == "gateway":
            depends["aggregator"] = HEALTHY
            health = ("health", ["CMD", "zmqflow", "healthcheck", "--http",
                                 f"http://127.0.0.1:{GATEWAY_PORT}/v2/health/ready"])
        options = {key: f"${{{VARIABLES[role, key]}:-{value}}}" if (role, key) in VARIABLES else value
                   for key, value in task.options.items()}
        argv = type(task)(role, task.index, task.command, options).argv()[1:]
        published = {"aggregator": [(AGGREGATOR_PORT, "ZMQFLOW_AGGREGATOR_PORT")],
                     "gateway": [(GATEWAY_PORT, "ZMQFLOW_GATEWAY_PORT"),
                                 (GATEWAY_GRPC_PORT, "ZMQFLOW_GATEWAY_GRPC_PORT")]}.get(role)
        services.append(_service(name, argv, task.env, expose, depends, health, published=published,
                                 volumes=["zmqflow-keys:/keys"] if role == "keys" else None,
                                 restart="unless-stopped" if role in SERVING else None))
    with open(TEMPLATE, encoding="utf-8") as f:
        template = f.read().split("\n", 2)[2]
    return template % dict(fields, services="\n\n".join(services), dashboard=_dashboard(ps, workers, serves))


def _dashboard(ps, workers, serves):
    """The profiled dashboard, `zmqflow status --web` on every task of the job."""
    command = ["status", "--web", "--web-bind", f"0.0.0.0:{DASHBOARD_PORT}", "--interval-secs", "2",
               "--broker", f"broker:{BROKER_PORT}", "--ps", _addresses(ps, PS_PORT),
               "--serve", _addresses(serves, SERVE_PORT), "--aggregator", f"aggregator:{AGGREGATOR_PORT}",
               "--worker-metrics", _addresses(workers, WORKER_PORT + METRICS_OFFSET)]
    return _service("dashboard", command, {KEY_ENV: "serving"}, [DASHBOARD_PORT], {"keys": COMPLETED},
                    ("health_watch", ["CMD", "zmqflow", "healthcheck", "--http",
                                      f"http://127.0.0.1:{DASHBOARD_PORT}/api/snapshot"]),
                    published=[(DASHBOARD_PORT, "ZMQFLOW_DASHBOARD_PORT")], profile="dashboard")


def _addresses(names, base):
    return ",".join(f"{name}:{base + i}" for i, name in enumerate(names))


def _service(name, argv, env, expose, depends, health, published=None, volumes=None, profile=None, restart=None):
    lines = [f"  {name}:" + (f"  # {COMMENTS[name]}" if name in COMMENTS and "\n" not in COMMENTS[name] else "")]
    if name in COMMENTS and "\n" in COMMENTS[name]:
        lines.insert(0, f"  # {COMMENTS[name]}".replace("\n# ", "\n  # "))
    lines.append("    <<: *zmqflow")
    if profile:
        lines.append(f'    profiles: ["{profile}"]')
    lines.append(_flow("    command: ", argv))
    if restart:
        lines.append(f"    restart: {restart}")
    if volumes:
        lines.append(_flow("    volumes: ", volumes))
    if env:
        lines += ["    environment:", "      <<: *environment"]
        lines += [f"      {key}: {_scalar(value)}" for key, value in env.items()]
    if expose:
        lines.append(_flow("    expose: ", [str(port) for port in expose]))
    if published:   # [(container port, the variable of its host port)]
        ports = [f"127.0.0.1:${{{variable}:-{port}}}:{port}" for port, variable in published]
        comment = "   # the host's loopback only"
        lines.append(_flow("    ports: ", ports, width=118 - len(comment)) + comment)
    if depends:
        lines.append("    depends_on:")
        lines += [f"      {dep}: {{condition: {condition}}}" for dep, condition in depends.items()]
    if health is None:
        lines.append("    healthcheck: {disable: true}")
    else:
        anchor, test = health
        lines += ["    healthcheck:", f"      <<: *{anchor}", _flow("      test: ", test)]
    return "\n".join(lines)


def _scalar(value):
    """A YAML flow scalar: JSON's double quotes, or single quotes around text holding double quotes."""
    value = str(value)
    return f"'{value}'" if '"' in value and "'" not in value else json.dumps(value)


def _flow(prefix, items, width=118):
    """`prefix[a, b, ...]`, wrapped under the bracket past `width` columns."""
    lines, line = [], prefix + "["
    for i, item in enumerate(items):
        piece = _scalar(item) + ("]" if i == len(items) - 1 else ",")
        if len(line) + len(piece) + 1 > width and not line.endswith("["):
            lines.append(line)
            line = " " * (len(prefix) + 1) + piece
        else:
            line += ("" if line.endswith("[") else " ") + piece
    return "\n".join(lines + [line if items else prefix + "[]"])
