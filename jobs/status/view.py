"""A status snapshot (probe.py) as the web page's tables: plain rows of display values, one list per table.

The page draws these rows as they come, so every name a service or a metric uses is read here,
in Python, once: `worker_values` is the one place that knows a worker's metric names.
"""


def worker_values(row):
    """A worker's metrics row (probe.scrape_worker) -> {examples_per_s, loss, global_step, steps}."""
    return {"examples_per_s": row.get("examples_per_second"), "loss": row.get("loss"),
            "global_step": row.get("global_step"), "steps": row.get("steps_total")}


def validation_values(row):
    """The chief's last validation from its metrics row: ({metric: value}, global step), or ({}, None)."""
    metrics = row.get("validation") or {}
    return dict(metrics), row.get("validation_global_step") if metrics else None


def page_view(snap):
    """{time, tasks, queues, shards, workers, members, aggregators, validation} for the page's tables."""
    tasks = snap["tasks"]
    trained = {w["replica"]: w for w in snap.get("workers", [])}
    scraped = {w["replica"]: w for w in snap.get("worker_metrics", [])}
    validation = next((validation_values(w) for w in snap.get("worker_metrics", []) if w.get("validation")), ({}, None))
    return {"time": snap["time"],
            "tasks": [_task_row(t) for t in tasks],
            "queues": [_queue_row(t, q) for t in tasks if t.get("service") == "queue-broker" and t.get("detail")
                       for q in t["detail"].get("queues", [])],
            "shards": [_shard_row(t) for t in tasks if t.get("service") == "ps-shard" and t.get("detail")],
            "workers": [_worker_row(r, trained.get(r), scraped.get(r)) for r in sorted(set(trained) | set(scraped))],
            "aggregators": [_aggregator_row(t) for t in tasks if t["job"] == "aggregator" and t.get("detail")],
            "members": [_member_row(t, m) for t in tasks if t["job"] == "aggregator" and t.get("detail")
                        for m in t["detail"].get("members", [])],
            "validation": {"metrics": validation[0], "global_step": validation[1]}}


def _task_row(task):
    return {"task": f"{task['job']}:{task['task']}", "address": task["address"], "status": task["status"],
            "service": task.get("service"), "uptime_s": task.get("uptime_s"), "rtt_ms": task.get("rtt_ms"),
            "error": task.get("error")}


def _queue_row(task, queue):
    name = f"{queue['container']}/{queue['shared_name']}" if queue.get("container") else queue["shared_name"]
    return {"broker": f"{task['job']}:{task['task']}", "queue": name, "kind": queue["kind"], "size": queue["size"],
            "capacity": None if queue["capacity"] < 0 else queue["capacity"], "closed": queue["closed"],
            "waiting_enqueues": queue["waiting_enqueues"], "waiting_dequeues": queue["waiting_dequeues"]}


def _shard_row(task):
    detail = task["detail"]
    mean, worst = _staleness(detail.get("staleness") or {})
    return {"shard": f"ps:{detail.get('shard', task['task'])}", "step": detail.get("version"),
            "steps_per_s": detail.get("steps_per_s"), "staleness_mean": mean, "staleness_max": worst,
            "pushes": detail.get("pushes_received"), "dropped": sum((detail.get("dropped") or {}).values())}


def _staleness(histogram):
    """Mean and largest staleness of the pushes a shard received ({versions behind: pushes})."""
    counts = {int(s): n for s, n in histogram.items() if n}
    total = sum(counts.values())
    if not total:
        return None, None
    return round(sum(s * n for s, n in counts.items()) / total, 2), max(counts)


def _worker_row(replica, trained, scraped):
    values = worker_values(scraped) if scraped and scraped["status"] == "up" else {}
    return {"worker": f"worker:{replica}", "state": trained["state"] if trained else None,
            "last_push_s": trained["last_push_s"] if trained else None,
            "metrics": scraped["status"] if scraped else None, **values}


def _aggregator_row(task):
    detail = task["detail"]
    members, latency = detail.get("members", []), detail.get("latency_ms") or {}
    return {"aggregator": f"{task['job']}:{task['task']}", "mode": detail.get("mode"),
            "healthy": sum(1 for m in members if m["healthy"]), "members": len(members),
            "requests": detail.get("requests"), "failed": detail.get("failed"),
            "latency_p50_ms": latency.get("p50"), "latency_p99_ms": latency.get("p99"), "rtt_ms": task.get("rtt_ms")}


def _member_row(task, member):
    return {"aggregator": f"{task['job']}:{task['task']}", "member": member["address"], "healthy": member["healthy"],
            "answers": member.get("answers", 0), "timeouts": member.get("timeouts", 0),
            "errors": member.get("errors", 0), "outstanding": member.get("outstanding", 0)}
