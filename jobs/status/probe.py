"""One snapshot of a cluster: every serving task asked in parallel, each bounded by one timeout.

A task that does not answer is `down` with the error, never an exception. What is
asked depends on the service that answers `info`: the broker's queues, a ps shard's
stats (version, pushes, and the workers it has heard from), a model server's
model_info, an aggregator's members. Workers serve no RPC: their state comes from
ps 0's stats, and their rates from their Prometheus endpoints when given.
"""

import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from zmqflow.common.rpc.probe import probe
from zmqflow.jobs.cluster_check import CLIENT_JOBS


def probe_task(job, index, address, timeout):
    """{job, task, address, status: up|down, service, pid, uptime_s, metrics, detail, error}."""
    row = {"job": job, "task": index, "address": address, "status": "down", "service": None, "error": None}
    answer = probe(address, timeout, detail=True, name="status")
    if not answer.up:
        row["error"] = answer.error[:300]
        return row
    info = answer.info
    row.update(status="up", service=info.get("service"), pid=info.get("pid"), uptime_s=info.get("uptime_s"),
               metrics=info.get("metrics"), parked=info.get("parked"), rtt_ms=answer.rtt_ms)
    if answer.detail is not None:
        row["detail"] = answer.detail
    return row


def scrape_worker(index, address, timeout):
    """A worker's Prometheus endpoint (host:port or URL): up/down, its zmqflow_worker_* values
    (steps_total, examples_total, global_step, loss) and the chief's last validation (`validation`:
    {metric: value}, `validation_global_step`); `examples_per_second` is None until `add_rates` has a
    previous snapshot to take the counter's difference from."""
    from prometheus_client.parser import text_string_to_metric_families
    url = address if "://" in address else f"http://{address}/metrics"
    row = {"replica": index, "metrics": url, "status": "down", "error": None, "examples_per_second": None}
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            text = answer.read().decode()
    except (OSError, ValueError) as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        return row
    row["status"] = "up"
    for family in text_string_to_metric_families(text):
        if family.name.startswith("zmqflow_worker_"):
            for sample in family.samples:
                if not sample.name.endswith("_created"):
                    row[sample.name[len("zmqflow_worker_"):]] = sample.value
        elif family.name == "zmqflow_validation_metric":      # the chief's, once it has validated
            row["validation"] = {s.labels["metric"]: s.value for s in family.samples if "metric" in s.labels}
        elif family.name == "zmqflow_validation_global_step" and family.samples:
            row["validation_global_step"] = family.samples[0].value
    return row


def workers_from_ps(ps_rows):
    """The workers ps 0 has heard from: done, lost, or pushing (seconds since the last push)."""
    stats = next((r.get("detail") for r in ps_rows if r["status"] == "up" and r.get("detail")), None)
    if stats is None:
        return []
    done, lost = set(stats.get("done_workers", [])), set(stats.get("lost_workers", []))
    idle = {int(r): s for r, s in stats.get("replica_idle_s", {}).items()}
    rows = []
    for replica in sorted(set(idle) | done | lost):
        state = "lost" if replica in lost else "done" if replica in done else "training"
        rows.append({"replica": replica, "state": state, "last_push_s": idle.get(replica)})
    return rows


def snapshot(spec, worker_metrics=(), timeout=1.0):
    """{time, tasks: [...], workers: [...], worker_metrics: [...]} for the cluster `spec`."""
    targets = [(job, index, address) for job, index, address in spec.tasks() if job not in CLIENT_JOBS]
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(targets) + len(worker_metrics)))) as pool:
        tasks = [pool.submit(probe_task, job, index, address, timeout) for job, index, address in targets]
        scraped = [pool.submit(scrape_worker, i, a, timeout) for i, a in enumerate(worker_metrics)]
        tasks = [f.result() for f in tasks]
        scraped = [f.result() for f in scraped]
    clients = [{"job": job, "task": index, "address": address, "status": "client"}
               for job, index, address in spec.tasks() if job in CLIENT_JOBS]
    return {"time": time.time(), "tasks": tasks + clients,
            "workers": workers_from_ps([t for t in tasks if t["job"] == "ps"]), "worker_metrics": scraped}


def add_rates(current, previous):
    """Rates between two snapshots, from counters (the endpoints export no rates): steps/s of each ps
    shard (set on the current one's detail) and examples/s of each scraped worker."""
    if previous is None:
        return current
    before = {(t["job"], t["task"]): t for t in previous["tasks"]}
    elapsed = current["time"] - previous["time"]
    for task in current["tasks"]:
        old = before.get((task["job"], task["task"]))
        if task.get("service") == "ps-shard" and old and old.get("detail") and task.get("detail") and elapsed > 0:
            task["detail"]["steps_per_s"] = round((task["detail"]["version"] - old["detail"]["version"]) / elapsed, 2)
    scraped = {w["metrics"]: w for w in previous.get("worker_metrics", [])}
    for worker in current.get("worker_metrics", []):
        worker["examples_per_second"] = counter_rate(worker, scraped.get(worker["metrics"]), "examples_total", elapsed)
    return current


def counter_rate(row, previous_row, key, elapsed):
    """Per second increase of counter `key` between two rows; None without both values, and a counter
    that went down (the task restarted) counts from zero, as PromQL's rate() does."""
    if previous_row is None or elapsed <= 0 or row.get(key) is None or previous_row.get(key) is None:
        return None
    increase = row[key] - previous_row[key]
    return round((row[key] if increase < 0 else increase) / elapsed, 2)
