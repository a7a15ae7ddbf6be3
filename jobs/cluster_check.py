"""`zmqflow cluster check`: is a cluster spec valid, and does every server in it answer?

Jobs whose tasks only dial out (worker, chief, master, evaluator, reader: they
bind no socket here) are listed but not pinged, unless asked; every other task
(ps, broker, serve, aggregator, ...) must answer a ping within the timeout.
Pings run in parallel, one client per thread, so the whole check is bounded by
one timeout.
"""

from concurrent.futures import ThreadPoolExecutor

from zmqflow.common.cluster.spec import ClusterSpec
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.rpc.probe import probe

CLIENT_JOBS = frozenset({"worker", "chief", "master", "evaluator", "reader"})


def spec_from_options(cluster_file=None, job_flags=(), shortcuts=None, env=None):
    """The ClusterSpec from a file, `--job` flags plus `--ps/--worker/...` shortcuts, or TF_CONFIG;
    None when nothing describes a cluster. Addresses may carry a tcp:// scheme."""
    flags = [_flag(job, rest) for job, _, rest in (flag.partition("=") for flag in job_flags)]
    flags += [_flag(job, value) for job, values in (shortcuts or {}).items() for value in values]
    sources = sum([bool(cluster_file), bool(flags)])
    if sources > 1:
        raise InvalidArgumentError("give the cluster one way: --cluster FILE, or --job/--ps/--worker flags")
    if cluster_file:
        return ClusterSpec.from_file(cluster_file)
    if flags:
        return ClusterSpec.from_flags(flags)
    task = ClusterSpec.from_tf_config(env)
    return task.cluster if task is not None else None


def _flag(job, addresses):
    """'job=a,b' with any tcp:// scheme taken off each address (ClusterSpec wants host:port)."""
    return f"{job}=" + ",".join(_strip(a) for a in addresses.split(",") if a.strip())


def _strip(address):
    address = address.strip()
    return address.split("://", 1)[1] if "://" in address else address


def ping(address, timeout):
    """{'status': 'up'|'down', 'latency_ms', 'service', 'error'} for one 'host:port'."""
    answer = probe(address, timeout)
    if answer.up:
        return {"status": "up", "latency_ms": answer.rtt_ms, "service": answer.info.get("service"), "error": None}
    return {"status": "down", "latency_ms": None, "service": None, "error": answer.error[:200],
            "waited_s": answer.waited_s}


def check(spec, timeout=2.0, ping_all=False):
    """One row per task: job, task, address, status (up/down/client), latency_ms, service, error."""
    rows = [{"job": job, "task": index, "address": address} for job, index, address in spec.tasks()]
    targets = [row for row in rows if ping_all or row["job"] not in CLIENT_JOBS]
    for row in rows:
        if row not in targets:
            row.update(status="client", latency_ms=None, service=None, error=None)
    if targets:
        with ThreadPoolExecutor(max_workers=min(32, len(targets))) as pool:
            for row, result in zip(targets, pool.map(lambda r: ping(r["address"], timeout), targets)):
                row.update(result)
    return rows


def healthy(rows):
    return all(row["status"] != "down" for row in rows)


def table(rows):
    """The rows as an aligned text table."""
    head = ("job", "task", "address", "status", "latency_ms", "service")
    lines = [head] + [(r["job"], str(r["task"]), r["address"], r["status"],
                       "-" if r["latency_ms"] is None else f"{r['latency_ms']:.2f}", r["service"] or "-")
                      for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)
    errors = [f"{r['job']}:{r['task']} {r['address']}: {r['error']}" for r in rows if r.get("error")]
    return text + ("\n" + "\n".join(errors) if errors else "")
