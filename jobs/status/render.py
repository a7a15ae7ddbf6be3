"""A status snapshot as plain text: one line per task, then queues, ps shards, workers, members."""


def render(snap):
    lines = [_table(("task", "address", "status", "service", "uptime", "info"),
                    [(f"{t['job']}:{t['task']}", t["address"], t["status"], t.get("service") or "-",
                      _uptime(t.get("uptime_s")), _summary(t)) for t in snap["tasks"]])]
    for task in snap["tasks"]:
        if task.get("service") == "queue-broker" and task.get("detail"):
            queues = task["detail"].get("queues", [])
            lines += ["", f"queues on {task['job']}:{task['task']}" + ("" if queues else ": none")]
            if queues:
                lines.append(_table(("queue", "kind", "size", "capacity", "closed", "enq_wait", "deq_wait"),
                                    [(_qname(q), q["kind"], q["size"],
                                      "unbounded" if q["capacity"] < 0 else q["capacity"],
                                      "yes" if q["closed"] else "no", q["waiting_enqueues"], q["waiting_dequeues"])
                                     for q in queues]))
    shards = [t for t in snap["tasks"] if t.get("service") == "ps-shard" and t.get("detail")]
    if shards:
        lines += ["", _table(("ps", "version", "steps/s", "pushes", "applied", "dropped", "pulls"),
                             [(f"ps:{t['detail'].get('shard', t['task'])}", t["detail"]["version"],
                               t["detail"].get("steps_per_s", "-"), t["detail"]["pushes_received"],
                               t["detail"]["pushes_applied"], _dropped(t["detail"].get("dropped", {})),
                               t["detail"]["pulls"]) for t in shards])]
    if snap["workers"]:
        lines += ["", _table(("worker", "state", "last push"),
                             [(f"worker:{w['replica']}", w["state"],
                               "-" if w["last_push_s"] is None else f"{w['last_push_s']:.1f} s ago")
                              for w in snap["workers"]])]
    if snap["worker_metrics"]:
        lines += ["", _table(("worker", "metrics", "status", "examples/s", "steps", "global step"),
                             [(f"worker:{w['replica']}", w["metrics"], w["status"],
                               _num(w.get("examples_per_second")), _num(w.get("steps_total")),
                               _num(w.get("global_step"))) for w in snap["worker_metrics"]])]
    for task in snap["tasks"]:
        if task["job"] == "aggregator" and task.get("detail"):
            lines += ["", f"members of aggregator:{task['task']}",
                      _table(("member", "healthy", "answers", "timeouts", "errors"),
                             [(m["address"], "yes" if m["healthy"] else "no", m.get("answers", 0),
                               m.get("timeouts", 0), m.get("errors", 0)) for m in task["detail"].get("members", [])])]
    down = [t for t in snap["tasks"] if t["status"] == "down"]
    if down:
        lines += [""] + [f"{t['job']}:{t['task']} {t['address']}: {t['error']}" for t in down]
    return "\n".join(lines)


def _summary(task):
    detail = task.get("detail") or {}
    if task.get("service") == "queue-broker":
        return f"{len(detail.get('queues', []))} queues, {task.get('parked', 0)} waiting"
    if task.get("service") == "ps-shard":
        return f"version {detail.get('version')}" + ("" if detail.get("initialized", True) else " (not initialized)")
    if task.get("service") == "serve":
        return f"model {detail.get('model')} v{detail.get('version')}"
    if task["job"] == "aggregator" and detail:
        members = detail.get("members", [])
        return f"{sum(1 for m in members if m['healthy'])}/{len(members)} members healthy"
    return ""


def _qname(q):
    return f"{q['container']}/{q['shared_name']}" if q.get("container") else q["shared_name"]


def _dropped(dropped):
    return ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())) or "0"


def _uptime(seconds):
    return "-" if seconds is None else f"{seconds:.0f} s"


def _num(value):
    return "-" if value is None else f"{value:,.0f}"


def _table(head, rows):
    rows = [tuple(str(c) for c in row) for row in rows]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows])


def queue_table(rows):
    """The broker's queues as an aligned text table."""
    if not rows:
        return "(no queues)"
    head = ("handle", "container", "name", "kind", "size", "capacity", "closed", "enq_wait", "deq_wait")
    table = [head] + [(str(q["handle"]), q["container"] or "-", q["name"], q["kind"], str(q["size"]),
                       "unbounded" if q["capacity"] < 0 else str(q["capacity"]), "yes" if q["closed"] else "no",
                       str(q["waiting_enqueues"]), str(q["waiting_dequeues"])) for q in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table)
