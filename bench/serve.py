"""Serving benchmark: one model server alone, then an aggregator over 3, then with one of them killed.

Phases (model servers and aggregators are real processes started by PID):
  server_max_qps  one client, closed loop, batch 1: predicts/s of one model server.
  direct          one member called directly at `rate` requests/s, OPEN loop: requests leave on a
                  schedule whatever the replies do; latency counts from the scheduled time.
  agg3            the same load through an aggregator (ensemble, mean) over 3 members.
  agg3_replica    the same aggregator in replica mode (each request to the least busy member).
  agg3_dead       ensemble with one member SIGKILLed, the aggregator's deadline `deadline_ms`.

Costs per request are also given as CPU microseconds of the aggregator and of a server
(from /proc): on a shared 2-core machine they hold up better than latencies, and show
what an ensemble of 3 costs against one direct call.

The open-loop driver is the load test's (loadtest/open_loop.py), over a plain RpcClient so
both paths send the same `predict`. Members serve a randomly initialised
MNIST MLP checkpoint (the values do not matter for speed) with no batching delay.
"""

import collections
import json
import os
import tempfile
import time

import numpy as np

from zmqflow.models.spec import MNIST_MLP

from zmqflow.models.registry import load_model
from zmqflow.common.processes import start_service
from zmqflow.common.rpc_client import RpcClient
from zmqflow.common.serve_client import ModelClient
from zmqflow.loadtest.open_loop import run_open_loop
from zmqflow.common.protocol import ServeOps

TARGETS = {"agg3_p99_ms": 5.0, "agg3_overhead_p50_ms": 0.5, "dead_slack_ms": 5.0}


def write_random_checkpoint(ckpt_dir, seed=1, spec=MNIST_MLP, step=1):
    """A committed checkpoint of `spec` at its initial values for `seed` (one shard, whole variables)."""
    from zmqflow.common.checkpoint import commit, write_shard
    values = load_model(spec).initial_values(seed)
    pieces = {name: ({"variable": name, "row_start": 0, "row_end": value.shape[0] if value.ndim else 1}, value, {})
              for name, value in values.items()}
    write_shard(ckpt_dir, step, 0, pieces)
    return commit(ckpt_dir, step, 1, {"model": spec})


def closed_loop_qps(endpoint, x, seconds):
    with ModelClient(endpoint, timeout=10.0) as client:
        for _ in range(50):
            client.predict(x)
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            client.predict(x)
            n += 1
        return n / (time.perf_counter() - start)


def open_loop(endpoint, x, rate, seconds, args=None, deadline_ms=None, warmup=50):
    """Send predict at `rate`/s for `seconds` without waiting (the load test's open-loop driver);
    (latencies ms of answers, counts of errors by kind)."""
    with RpcClient(endpoint, name="bench-serve") as client:
        timeout = None if deadline_ms is None else deadline_ms / 1000.0

        def submit():
            return client.submit(ServeOps.PREDICT, args or {}, [x], timeout=timeout)  # the aggregator's op too
        if warmup:
            run_open_loop(submit, client.poll, rate, warmup / rate)
        outcomes = run_open_loop(submit, client.poll, rate, seconds).outcomes
    errors = collections.Counter(o.error for o in outcomes if o.error is not None)
    return np.asarray([o.latency_ms for o in outcomes if o.error is None]), dict(errors)


def cpu_seconds(pid):
    """User + system CPU seconds a process has used (Linux /proc): cost per request holds up on a busy machine."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _pct(latencies, q):
    return round(float(np.percentile(latencies, q)), 3) if len(latencies) else None


def run(seconds=3.0, rate=500, deadline_ms=50, members=3, profile_dir=None, progress=None):
    say = progress or (lambda *_: None)
    work = tempfile.mkdtemp(prefix="zmqflow-bench-serve-")
    x = np.random.default_rng(0).random((1, 784), dtype=np.float32)
    env = {"ZMQFLOW_PROFILE_DIR": profile_dir} if profile_dir else None
    servers, aggs = [], []
    try:
        for i in range(members):
            ckpt = os.path.join(work, f"ckpt{i}")
            write_random_checkpoint(ckpt, seed=i + 1)
            servers.append(start_service("zmqflow.services.serve", ["--checkpoint", ckpt, "--backend", "numpy",
                                                            "--max-delay-ms", "0", "--log-level", "WARNING"],
                                         log_dir=work))
        endpoints = [s.endpoint for s in servers]
        result = {"rate": rate, "duration_s": seconds, "members": members, "deadline_ms": deadline_ms}
        result["server_max_qps"] = round(closed_loop_qps(endpoints[0], x, seconds), 1)
        say(f"one model server, closed loop batch 1: {result['server_max_qps']:,.0f} predicts/s")
        cpu = cpu_seconds(servers[0].pid)
        lat, errors = open_loop(endpoints[0], x, rate, seconds, deadline_ms=1000)
        result.update(direct_p50_ms=_pct(lat, 50), direct_p99_ms=_pct(lat, 99), direct_errors=sum(errors.values()),
                      server_cpu_us_per_request=round((cpu_seconds(servers[0].pid) - cpu) / (rate * seconds + 50) * 1e6,
                                                      1))
        say(f"direct at {rate}/s open loop: p50 {result['direct_p50_ms']} ms, p99 {result['direct_p99_ms']} ms, "
            f"server CPU {result['server_cpu_us_per_request']} us/request")

        member_args = [a for e in endpoints for a in ("--member", e)]
        agg = start_service("zmqflow.services.aggregator", [*member_args, "--log-level", "WARNING"], log_dir=work, env=env)
        aggs.append(agg)
        cpu = cpu_seconds(agg.pid)
        lat, errors = open_loop(agg.endpoint, x, rate, seconds, deadline_ms=1000)
        result.update(agg3_p50_ms=_pct(lat, 50), agg3_p99_ms=_pct(lat, 99), agg3_p999_ms=_pct(lat, 99.9),
                      agg3_errors=sum(errors.values()),
                      agg3_cpu_us_per_request=round((cpu_seconds(agg.pid) - cpu) / (rate * seconds + 50) * 1e6, 1))
        say(f"aggregator over {members} at {rate}/s: p50 {result['agg3_p50_ms']} ms, p99 {result['agg3_p99_ms']} ms, "
            f"aggregator CPU {result['agg3_cpu_us_per_request']} us/request")

        lat, errors = open_loop(agg.endpoint, x, rate, seconds, args={"mode": "replica"}, deadline_ms=1000)
        result.update(agg3_replica_p50_ms=_pct(lat, 50), agg3_replica_p99_ms=_pct(lat, 99),
                      agg3_replica_errors=sum(errors.values()))
        say(f"the same aggregator in replica mode: p50 {result['agg3_replica_p50_ms']} ms, "
            f"p99 {result['agg3_replica_p99_ms']} ms")

        dead = start_service("zmqflow.services.aggregator", [*member_args, "--deadline-ms", str(deadline_ms),
                                                     "--log-level", "WARNING"], log_dir=work, env=env)
        aggs.append(dead)
        open_loop(dead.endpoint, x, rate, 0.2)  # connected and warm before the member dies
        servers[-1].kill()
        lat, errors = open_loop(dead.endpoint, x, rate, seconds, warmup=0)
        result.update(agg3_dead_p50_ms=_pct(lat, 50), agg3_dead_p99_ms=_pct(lat, 99),
                      agg3_dead_max_ms=round(float(lat.max()), 3) if len(lat) else None,
                      agg3_dead_errors=sum(errors.values()))
        say(f"one member killed, deadline {deadline_ms} ms: p50 {result['agg3_dead_p50_ms']} ms, "
            f"p99 {result['agg3_dead_p99_ms']} ms, max {result['agg3_dead_max_ms']} ms, "
            f"errors {result['agg3_dead_errors']}")
    finally:
        for proc in aggs + servers:
            proc.stop()
    overhead = None if result.get("agg3_p50_ms") is None else round(result["agg3_p50_ms"] - result["direct_p50_ms"], 3)
    result["agg3_overhead_p50_ms"] = overhead
    result["targets"] = {
        "agg3_p99_ms<=5": result["agg3_p99_ms"] is not None and result["agg3_p99_ms"] <= TARGETS["agg3_p99_ms"],
        "agg3_overhead_p50_ms<=0.5": overhead is not None and overhead <= TARGETS["agg3_overhead_p50_ms"],
        "agg3_dead_p99_ms<=deadline+5": result["agg3_dead_p99_ms"] is not None and
        result["agg3_dead_p99_ms"] <= deadline_ms + TARGETS["dead_slack_ms"],
        "agg3_dead_errors==0": result["agg3_dead_errors"] == 0,
    }
    result["all_targets_met"] = all(result["targets"].values())
    return result


if __name__ == "__main__":
    print(json.dumps(run(progress=print)))
