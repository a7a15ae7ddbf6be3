"""The ps:worker ratio and bandwidth study: examples/s of real clusters whose tasks are hosts of their own.

For each model (the MNIST MLP, the tutorial CNN, the sparse embedding model of examples/sparse_embedding.py),
each link bandwidth (tc rate: 100mbit, 1gbit, 10gbit) and each point of the grid ps x workers, a job of
fresh ps shards and workers runs across Linux network namespaces (common/processes/netns.py, the hosts the
netns tests use): every ps shard and every worker a host of its own whose link is shaped by htb to the
bandwidth, with `delay_ms` a netem delay on its sending side (where the kernel has sch_netem); the broker
and the reader that streams the training rows (one pair per model and bandwidth, dequeued by each point's
workers in turn) share an input host whose link is not shaped (the input feed is not what is studied;
its bytes are reported). The job is the one
`zmqflow train` runs (jobs/spec.py's tasks, jobs/local_cluster.py's prepare_data: readers, async, batch
100), its variables split evenly over the shards (max_shard_bytes: the largest over the shard count), each
task started in its namespace by the Supervisor; nothing in the root namespace reaches them.

Once every worker trains, a window of `seconds` is measured: the job's examples/s (the global step the
workers' summaries record, times the batch), the bytes each host's eth0 sent and received (the kernel's
interface counters) per global step, each link's utilisation (its busier direction over the bandwidth),
the CPU our tasks used and the machine's busy share. Each row says what limits it (classify): `ps link`,
`worker link`, `cpu`, else `-`. The knee of a
(model, bandwidth, ps) line is the first worker count after which more workers add under KNEE_GAIN.
Root only (network namespaces): `run` raises Unavailable with the reason otherwise.
"""

import bisect
import itertools
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from zmqflow.common.errors import InvalidArgumentError, UnavailableError
from zmqflow.common.processes import netns
from zmqflow.common.processes.children import compute_thread_env
from zmqflow.common.processes.supervisor import Supervisor

MODELS = ("mlp", "cnn", "embedding")
BATCH = 100
LINK_BUSY = 0.8          # a link this busy (classify: over its rate) is what limits the row
CPU_BUSY = 0.9           # the machine this busy: the CPU limits the row
KNEE_GAIN = 1.15         # doubling the workers adds less than this: the line has reached its knee
_INSECURE = {"ZMQFLOW_INSECURE": "1"}    # services beyond loopback without CURVE: only these namespaces reach them
READY_S = 90             # every worker's first step, at most (a busy 2-core machine starts 14 Pythons)
INPUT_HOST = "input"
MIN_STEPS = 12           # global steps a window spans at least (slow steps stretch it, up to WINDOW_STRETCH times)
WINDOW_STRETCH = 10
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def bandwidth_bits(rate):
    """Bits per second of a tc rate such as 100mbit, 1gbit, 10gbit; InvalidArgument for another form."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?bit)\s*", str(rate).lower())
    if not match or float(match.group(1)) <= 0:
        raise InvalidArgumentError(f"bandwidth {rate!r}: a positive number and a unit of {', '.join(_UNITS)} "
                                   "(tc's rates, e.g. 100mbit, 1gbit, 10gbit)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def example_file(name):
    """An example of the source checkout (examples/ is not part of the installed package)."""
    path = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "examples", name))
    if not os.path.isfile(path):
        raise InvalidArgumentError(f"the embedding model is examples/{name} of a source checkout; not found at {path}")
    return path


def job_options(model, directory):
    """The job_spec options of one of MODELS, with its data written under `directory` where it has its own."""
    if model == "mlp":
        return {"model": None, "data": None}
    if model == "cnn":
        return {"model": "cnn", "data": None}
    if model == "embedding":    # examples/sparse_embedding.py: its model, its made-up ratings, its optimizer
        from zmqflow.models.user_file import load_function
        path = example_file("sparse_embedding.py")
        ratings = load_function(path, "ratings", what="example file")
        ratings(os.path.join(directory, "train.npz"), 50_000)
        ratings(os.path.join(directory, "test.npz"), 1_000, seed=1)
        example = load_function(path, "build").__globals__     # the example's module: its USERS and ITEMS
        data = {"source": {"format": "npz"},
                "files": {"train": os.path.join(directory, "train.npz"), "test": os.path.join(directory, "test.npz")},
                "features": {name: {"type": "categorical", "vocabulary": list(range(example[count])), "encode": "ids"}
                             for name, count in (("user", "USERS"), ("item", "ITEMS"))},
                "label": {"column": "rating", "task": "regression"}}
        return {"model": {"type": f"{path}:build", "sparse": True}, "data": data,
                "optimizer": {"kind": "adam", "learning_rate": 0.01, "lazy": True}}
    raise InvalidArgumentError(f"model {model!r}: one of {', '.join(MODELS)}")


def prepare(model, directory):
    """The model's job spec (readers, async, batch 100, epochs enough for any window), its data prepared in
    `directory` once for every point; returns (spec, placement fields, the largest variable's bytes, all the
    variables' bytes)."""
    from zmqflow.jobs.local_cluster import prepare_data
    from zmqflow.jobs.spec import job_spec
    from zmqflow.models.registry import load_model
    from zmqflow.models.spec import resolve_model
    options = job_options(model, directory)
    spec = job_spec(None, input="readers", epochs=100_000, batch_size=BATCH, learning_rate_decay=False,
                    summary_every_steps=1, log_every=1_000_000, **options)
    prepared_dir = os.path.join(directory, "prepared")
    spec, _, prepared = prepare_data(spec, prepared_dir)
    values = load_model(resolve_model(os.path.join(prepared_dir, "model.json"))).initial_values(0)
    model_bytes = sum(v.nbytes for v in values.values())
    return spec, {"prepared": prepared_dir, "splits": tuple(prepared), "train_rows": prepared["train"].rows}, \
        max(v.nbytes for v in values.values()), model_bytes


def _records(path):
    """(time, global step) of every step record a worker's summaries file holds."""
    from zmqflow.jobs.job_metrics import JsonLinesTail
    return [(r["time"], r["step"]) for r in JsonLinesTail(path).new_records()
            if isinstance(r, dict) and "loss" in r and "step" in r and "time" in r]


def _steps_between(records, start, end):
    """Global steps per second between the times `start` and `end`, the global step at each interpolated
    between the workers' records either side of it (the records: (time, global step), sorted); None without
    a record before `start` and one after `end`."""
    if not records or records[0][0] > start or records[-1][0] < end:
        return None
    times = [t for t, _ in records]
    steps = list(itertools.accumulate((s for _, s in records), max))   # a worker's record may lag another's

    def at(t):
        i = bisect.bisect_right(times, t)
        j = min(i, len(times) - 1)
        (t0, s0), (t1, s1) = (times[i - 1], steps[i - 1]), (times[j], steps[j])
        return s0 if t1 <= t0 else s0 + (s1 - s0) * (t - t0) / (t1 - t0)
    return max(0.0, (at(end) - at(start)) / (end - start))


def _stepped(path):
    """Whether a worker's summaries file holds a record (it has trained a step)."""
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


def _last_time(path):
    """The time of the last record of a summaries file (0 when none)."""
    return max((t for t, _ in _tail_records(path)[-1:]), default=0.0)


def _last_step(paths):
    """The highest global step the summaries files' last records hold (0 when none)."""
    return max((step for path in paths for _, step in _tail_records(path)[-1:]), default=0)


def _tail_records(path):
    """(time, global step) of the complete records in a summaries file's last KB."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 1024))
            lines = f.read().decode(errors="replace").split("\n")[1:-1]
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            record = json.loads(line)
            out.append((record["time"], record["step"]))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def _cpu_seconds(pids):
    """User + system CPU seconds the processes have used so far (those still running)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def _machine_busy():
    """(busy, total) jiffies of every CPU so far (/proc/stat)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


def _links(hosts, names):
    return {name: hosts.link_bytes(name) for name in names}


def start_input(supervisor, hosts, spec, placement_fields, log_dir):
    """The broker and the reader(s) streaming the model's training rows, on the input host; the broker's
    endpoint. The points of one model and bandwidth share them (each point's workers dequeue from the queue)
    until one exits: a reader gives up on a queue that stays full past its enqueue deadline."""
    from zmqflow.jobs.spec import Placement, tasks
    broker = supervisor.start_service("zmqflow.services.broker", name="broker", prefix=hosts.run(INPUT_HOST, []),
                                      bind=f"tcp://{hosts.address(INPUT_HOST)}:*", env=_INSECURE, ready_timeout=60)
    for task in tasks(spec, Placement(broker.endpoint, log_dir=log_dir, **placement_fields)):
        if task.role == "reader":
            supervisor.start_process("zmqflow.services.reader", task.config_args(log_dir), name=task.name,
                                     prefix=hosts.run(INPUT_HOST, []), env=compute_thread_env(1))
    return broker.endpoint


def run_point(hosts, spec, placement_fields, broker, num_ps, num_workers, seconds, log_dir, largest_bytes, bits,
              feed):
    """One job of `num_ps` shards and `num_workers` workers on the namespaces `hosts`, fed from `broker`
    (`feed`: the Supervisor of the broker and readers): its measured row."""
    from zmqflow.jobs.spec import Placement, job_spec, tasks
    begun = time.monotonic()
    split = -(-largest_bytes // num_ps) if num_ps > 1 else None   # the largest variable in num_ps row blocks
    spec = job_spec(spec, num_ps=num_ps, num_workers=num_workers, max_shard_bytes=split)
    with Supervisor(log_dir=log_dir, stop_timeout=2.0, admin_token_value=feed.admin_token,
                    job_token_value=feed.job_token) as supervisor:
        planned = tasks(spec, Placement(broker, log_dir=log_dir, **placement_fields))

        def start_ps(task):
            host = f"ps{task.index}"
            return supervisor.start_service("zmqflow.services.ps", task.config_args(log_dir), name=task.name,
                                            prefix=hosts.run(host, []), bind=f"tcp://{hosts.address(host)}:*",
                                            env={**_INSECURE, **compute_thread_env(1)}, ready_timeout=60)
        with ThreadPoolExecutor(num_ps) as pool:     # the shards start together: each is a Python starting
            shards = list(pool.map(start_ps, [t for t in planned if t.role == "ps"]))
        planned = tasks(spec, Placement(broker, ps=tuple(s.endpoint for s in shards), log_dir=log_dir,
                                        **placement_fields))
        shards_s = time.monotonic() - begun
        workers = [supervisor.start_process("zmqflow.services.worker", task.config_args(log_dir), name=task.name,
                                            prefix=hosts.run(f"worker{task.index}", []), env=compute_thread_env(1))
                   for task in planned if task.role == "worker"]
        summaries = [os.path.join(log_dir, f"worker{i}-summaries.jsonl") for i in range(num_workers)]
        deadline = time.monotonic() + READY_S
        while not all(_stepped(path) for path in summaries):      # every worker has stepped
            failed = supervisor.first_failure() or feed.first_failure()
            if failed or time.monotonic() > deadline:
                child = failed[0] if failed else next(w for w, p in zip(workers, summaries) if not _stepped(p))
                why = f"exited with {failed[1]}" if failed else f"did not train within {READY_S} s"
                raise UnavailableError(f"{num_ps} ps x {num_workers} workers: {child.name} {why}:\n"
                                       f"{child.log()[-2000:]}")
            time.sleep(0.1)
        training_s = time.monotonic() - begun
        time.sleep(min(1.0, seconds / 3))                          # past the first steps' page faults
        names = [INPUT_HOST] + [f"ps{i}" for i in range(num_ps)] + [f"worker{i}" for i in range(num_workers)]
        pids = [child.pid for child in supervisor.children + feed.children]
        before, cpu0, busy0, wall0 = _links(hosts, names), _cpu_seconds(pids), _machine_busy(), time.time()
        first = _last_step(summaries)
        time.sleep(seconds)
        stretched = time.monotonic() + (WINDOW_STRETCH - 1) * seconds   # slow steps: a longer window, to count
        while time.monotonic() < stretched and _last_step(summaries) - first < MIN_STEPS:
            time.sleep(0.1)
        after, cpu1, busy1, wall1 = _links(hosts, names), _cpu_seconds(pids), _machine_busy(), time.time()
        deadline = time.monotonic() + max(10.0, seconds)          # a record after the window's end, to interpolate
        while time.monotonic() < deadline and max(map(_last_time, summaries)) <= wall1:
            time.sleep(0.05)
        failed = supervisor.first_failure() or feed.first_failure()
        if failed:
            raise UnavailableError(f"{num_ps} ps x {num_workers} workers: {failed[0].name} exited with {failed[1]}:"
                                   f"\n{failed[0].log()[-2000:]}")
        records = sorted(r for path in summaries for r in _records(path))
    steps_per_s = _steps_between(records, wall0, wall1)
    if steps_per_s is None:
        raise UnavailableError(f"{num_ps} ps x {num_workers} workers: no summary records either side of the "
                               f"{seconds:g} s window (a step slower than the window: give more --duration-secs)")
    elapsed = wall1 - wall0
    links = {}
    for name in names:
        tx, rx = after[name]["tx"] - before[name]["tx"], after[name]["rx"] - before[name]["rx"]
        per_step = (lambda b: round(b / elapsed / steps_per_s)) if steps_per_s else (lambda b: None)
        links[name] = {"tx_bytes_per_step": per_step(tx), "rx_bytes_per_step": per_step(rx),
                       "utilisation": round(max(tx, rx) * 8 / elapsed / bits, 3) if name != INPUT_HOST else None}

    def summed(prefix):
        values = [links[n]["tx_bytes_per_step"] + links[n]["rx_bytes_per_step"] for n in names
                  if n.startswith(prefix) and links[n]["tx_bytes_per_step"] is not None]
        return sum(values) if values else None
    ps_util = max(links[f"ps{i}"]["utilisation"] for i in range(num_ps))
    worker_util = max(links[f"worker{i}"]["utilisation"] for i in range(num_workers))
    busy = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1])
    return {"num_ps": num_ps, "num_workers": num_workers, "examples_per_s": round(steps_per_s * BATCH),
            "steps_per_s": round(steps_per_s, 1), "ps_bytes_per_step": summed("ps"),
            "worker_bytes_per_step": summed("worker"), "input_bytes_per_step": summed(INPUT_HOST),
            "ps_link_utilisation": ps_util, "worker_link_utilisation": worker_util,
            "tasks_cpu_cores": round((cpu1 - cpu0) / elapsed, 2), "machine_busy": round(busy, 3),
            "window_s": round(elapsed, 2), "shards_ready_s": round(shards_s, 1),
            "workers_training_s": round(training_s, 1), "links": links}


def classify(row, bits):
    """`row` with what limits it: `ps link` when a ps link's busier direction is LINK_BUSY of the rate (the
    workers' pulls and pushes cross it side by side), `worker link` when a worker's link carried LINK_BUSY of
    the rate in its two directions together (a worker pulls, computes, then pushes: one after the other),
    `cpu` when the machine was CPU_BUSY busy, else `-`; and that worker link share."""
    workers = [link for name, link in row["links"].items() if name.startswith("worker")]
    serial = max(((link["tx_bytes_per_step"] or 0) + (link["rx_bytes_per_step"] or 0)) * row["steps_per_s"] * 8 / bits
                 for link in workers)
    limit = ("ps link" if row["ps_link_utilisation"] >= LINK_BUSY else "worker link" if serial >= LINK_BUSY
             else "cpu" if row["machine_busy"] >= CPU_BUSY else "-")
    return {**row, "worker_link_serial": round(serial, 3), "limit": limit}


def knees(rows):
    """Per (model, bandwidth, ps): the worker count after which more workers add under KNEE_GAIN (None: the
    line still rises at the grid's end), and what limits it there."""
    lines = {}
    for row in rows:
        lines.setdefault((row["model"], row["bandwidth"], row["num_ps"]), []).append(row)
    out = []
    for (model, bandwidth, ps), line in lines.items():
        line.sort(key=lambda r: r["num_workers"])
        knee = next((a for a, b in zip(line, line[1:]) if b["examples_per_s"] < KNEE_GAIN * a["examples_per_s"]),
                    None)
        best = max(line, key=lambda r: r["examples_per_s"])
        out.append({"model": model, "bandwidth": bandwidth, "num_ps": ps,
                    "knee_workers": knee["num_workers"] if knee else None,
                    "knee_limit": knee["limit"] if knee else None,
                    "best_examples_per_s": best["examples_per_s"], "best_workers": best["num_workers"]})
    return out


def shards_pay(rows):
    """Per (model, bandwidth) and ps count above 1: its best examples/s over the grid's workers against 1 ps's."""
    best = {}
    for row in rows:
        key = (row["model"], row["bandwidth"], row["num_ps"])
        best[key] = max(best.get(key, 0), row["examples_per_s"])
    return [{"model": m, "bandwidth": b, "num_ps": p, "vs_1_ps": round(v / best[(m, b, 1)], 2)}
            for (m, b, p), v in best.items() if p > 1 and best.get((m, b, 1))]


def table(result):
    """The rows as a text table, the knees under them."""
    head = (f"{'model':<10} {'bandwidth':>9} {'ps':>3} {'workers':>7} {'examples/s':>10} {'ps B/step':>10} "
            f"{'worker B/step':>13} {'ps link':>7} {'w. link':>7} {'cores':>5} {'limit':<11}")
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        lines.append(f"{r['model']:<10} {r['bandwidth']:>9} {r['num_ps']:>3} {r['num_workers']:>7} "
                     f"{r['examples_per_s']:>10} {_size(r['ps_bytes_per_step']):>10} "
                     f"{_size(r['worker_bytes_per_step']):>13} {r['ps_link_utilisation']:>7.0%} "
                     f"{r['worker_link_serial']:>7.0%} {r['tasks_cpu_cores']:>5.2f} {r['limit']:<11}")
    lines.append("")
    for k in result["knees"]:
        where = (f"knee at {k['knee_workers']} workers ({k['knee_limit']})" if k["knee_workers"]
                 else "still rising at the grid's end")
        lines.append(f"{k['model']} {k['bandwidth']} {k['num_ps']} ps: {where}; best {k['best_examples_per_s']} "
                     f"examples/s with {k['best_workers']} workers")
    for s in result["shards_pay"]:
        lines.append(f"{s['model']} {s['bandwidth']}: {s['num_ps']} ps {s['vs_1_ps']}x 1 ps (best over the workers)")
    return "\n".join(lines)


def _size(n):
    if n is None:
        return "-"
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def plot(result, path):
    """examples/s against workers, a line per ps count, a panel per (model, bandwidth); knees marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(dict.fromkeys(r["model"] for r in result["rows"]))
    bandwidths = list(dict.fromkeys(r["bandwidth"] for r in result["rows"]))
    fig, axes = plt.subplots(len(models), len(bandwidths), squeeze=False,
                             figsize=(3.6 * len(bandwidths), 2.8 * len(models)))
    knee_at = {(k["model"], k["bandwidth"], k["num_ps"]): k["knee_workers"] for k in result["knees"]}
    for i, model in enumerate(models):
        for j, bandwidth in enumerate(bandwidths):
            ax = axes[i][j]
            for ps in sorted({r["num_ps"] for r in result["rows"]}):
                line = sorted((r for r in result["rows"] if (r["model"], r["bandwidth"], r["num_ps"]) ==
                               (model, bandwidth, ps)), key=lambda r: r["num_workers"])
                if not line:
                    continue
                xs, ys = [r["num_workers"] for r in line], [r["examples_per_s"] for r in line]
                drawn = ax.plot(xs, ys, marker="o", label=f"{ps} ps")[0]
                knee = knee_at.get((model, bandwidth, ps))
                if knee:
                    ax.plot([knee], [ys[xs.index(knee)]], marker="s", markersize=11, fillstyle="none",
                            color=drawn.get_color())
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r["num_workers"] for r in result["rows"]}))
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.set_ylim(bottom=0)
            ax.set_title(f"{model}, {bandwidth}", fontsize=10)
            ax.grid(alpha=0.3)
            if i == len(models) - 1:
                ax.set_xlabel("workers")
            if j == 0:
                ax.set_ylabel("examples/s")
            ax.legend(fontsize=8)
    fig.suptitle(f"zmqflow bench scaling (delay {result['delay_ms']} ms; squares: knees)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(num_ps=(1, 2, 4), num_workers=(1, 2, 4, 8), models=MODELS, bandwidths=("1gbit", "10gbit"), delay_ms=0.1,
        seconds=3.0, plot_path=None, progress=None):
    """The whole grid; the result with its rows, knees and ps-shard gains (see the module docstring)."""
    say = progress or (lambda *_: None)
    for model in models:
        if model not in MODELS:
            raise InvalidArgumentError(f"model {model!r}: one of {', '.join(MODELS)}")
    bits = {b: bandwidth_bits(b) for b in bandwidths}
    if min(num_ps) < 1 or min(num_workers) < 1:
        raise InvalidArgumentError("--num-ps and --num-workers take counts of 1 or more")
    if delay_ms is not None and delay_ms < 0:
        raise InvalidArgumentError(f"--delay-secs {delay_ms / 1000:g}: 0 or more")
    reason = netns.netns_unusable()
    if reason:
        raise UnavailableError(f"each task runs in a network namespace of its own: {reason}")
    reason = netns.delay_unusable() if delay_ms else None
    if reason:
        raise UnavailableError(f"--delay-secs {delay_ms / 1000:g}: {reason}; pass --delay-secs 0 for links shaped by rate alone")
    previous = signal.signal(signal.SIGTERM, _terminated) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        return _run_grid(num_ps, num_workers, models, bandwidths, delay_ms, seconds, plot_path, bits, say)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminated(signum, frame):
    """SIGTERM: leave by an exception, so that every task is stopped and every namespace deleted on the way."""
    raise SystemExit(128 + signum)


def _run_grid(num_ps, num_workers, models, bandwidths, delay_ms, seconds, plot_path, bits, say):
    hosts = [INPUT_HOST] + [f"ps{i}" for i in range(max(num_ps))] + [f"worker{i}" for i in range(max(num_workers))]
    root = tempfile.mkdtemp(prefix="zmqflow-scaling-")
    rows, failed, started = [], [], time.monotonic()
    try:
        prepared = {}
        for model in models:
            os.makedirs(os.path.join(root, model))
            prepared[model] = prepare(model, os.path.join(root, model))
            say(f"{model}: {prepared[model][3] / 1e6:.2f} MB of variables")
        for bandwidth in bandwidths:
            rates = {h: (None if h == INPUT_HOST else bandwidth) for h in hosts}
            with netns.NetworkNamespaces(hosts, rate=rates, delay_ms=delay_ms or None) as network:
                for model in models:
                    spec, fields, largest, model_bytes = prepared[model]
                    feed = None     # the input host's broker and reader, (re)started when one has exited
                    try:
                        for ps in num_ps:
                            for workers in num_workers:
                                if feed is None or feed.first_failure():
                                    if feed is not None:   # a reader gives up on a queue full for minutes
                                        feed.stop_all()
                                    feed_dir = tempfile.mkdtemp(prefix=f"{bandwidth}-input-",
                                                                dir=os.path.join(root, model))
                                    feed = Supervisor(log_dir=feed_dir, stop_timeout=2.0)
                                    broker = start_input(feed, network, spec, fields, feed_dir)
                                log_dir = os.path.join(root, model, f"{bandwidth}-{ps}ps-{workers}w")
                                os.makedirs(log_dir)
                                point = {"model": model, "bandwidth": bandwidth, "model_bytes": model_bytes}
                                try:
                                    row = classify({**point, **run_point(network, spec, fields, broker, ps, workers,
                                                                         seconds, log_dir, largest, bits[bandwidth],
                                                                         feed)}, bits[bandwidth])
                                except UnavailableError as error:   # one point failed: say why, go on
                                    failed.append({**point, "num_ps": ps, "num_workers": workers, "error": str(error)})
                                    say(f"{model} {bandwidth} {ps} ps x {workers} workers FAILED: {error}")
                                    continue
                                rows.append(row)
                                say(f"{model} {bandwidth} {ps} ps x {workers} workers: {row['examples_per_s']} "
                                    f"examples/s, ps {_size(row['ps_bytes_per_step'])}/step, ps link "
                                    f"{row['ps_link_utilisation']:.0%}, machine {row['machine_busy']:.0%} "
                                    f"({row['limit']}; {time.monotonic() - started:.0f} s)")
                    finally:
                        if feed is not None:
                            feed.stop_all()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {"benchmark": "scaling", "batch_size": BATCH, "delay_ms": delay_ms, "duration_secs": seconds,
              "cpus": os.cpu_count(), "bandwidths": list(bandwidths), "models": list(models),
              "rows": rows, "failed": failed, "knees": knees(rows), "shards_pay": shards_pay(rows),
              "wall_seconds": round(time.monotonic() - started, 1)}
    say(table(result))
    if plot_path:
        plot(result, plot_path)
        result["plot"] = plot_path
        say(f"plot: {plot_path}")
    return result
