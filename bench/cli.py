"""`zmqflow bench ...`: benchmarks that print one JSON object on their last line."""

import importlib
import json

import click

from zmqflow.common.processes.service_cli import option
from zmqflow.models.kernels import DEFAULT_BACKEND


@click.group()
def bench():
    """Benchmarks; each measures its own baseline in the same run and reports ratios."""


def _report(name, as_json, **options):
    """Run zmqflow.bench.<name> (progress lines unless --json) and print its result as one JSON line."""
    run = importlib.import_module(f"zmqflow.bench.{name}").run
    click.echo(json.dumps(run(progress=None if as_json else click.echo, **options)))


@bench.command()
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON result line.")
@option("--duration-secs", "seconds", old_names=["--seconds"],
        default=3.0, show_default=True, help="Duration of each throughput phase.")
@click.option("--window", default=8, show_default=True, help="Batches in flight per producer and consumer.")
@click.option("--clients", default=50, show_default=True, type=click.IntRange(min=1),
              help="Unpipelined clients of the small-ops phase (and of redis-benchmark's).")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(min=1),
              help="Rounds of broker-then-baseline; medians are reported.")
@click.option("--memory/--no-memory", "memory_phase", default=True, show_default=True,
              help="Measure the broker's RSS against a full queue's bytes.")
def broker(as_json, seconds, window, clients, rounds, memory_phase):
    """Queue-broker against baselines in the same run: small ops/s vs redis-benchmark LPUSH/RPOP (50 clients,
    unpipelined; skipped, saying why, without redis-server), the broker's CPU per request, one client's dequeue
    p50/p99, 313 KB batches vs a raw ZeroMQ relay, and the broker's RSS against the bytes a full shuffle (and
    FIFO) queue holds (memory_*: rss_over_held, above the idle broker)."""
    _report("broker", as_json, seconds=seconds, window=window, clients=clients, rounds=rounds,
            memory_phase=memory_phase)


@bench.command()
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON result line.")
@option("--duration-secs", "seconds", old_names=["--seconds"],
        default=3.0, show_default=True, help="Duration of each phase.")
@click.option("--backend", default="numba", show_default=True, type=click.Choice(["numba", "cupy"]),
              help="numba: the CPU kernels vs JAX on the CPU; cupy: the GPU step vs PyTorch CUDA on the same GPU.")
def kernels(as_json, seconds, backend):
    """Forward+backward steps/s of the MNIST MLP and the tutorial CNN (batch 100): on the CPU vs JAX, or on the GPU
    (--backend cupy) vs PyTorch CUDA, with and without the host copies a worker's step makes."""
    _report("kernels", as_json, seconds=seconds, backend=backend)


@bench.command()
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON result line.")
@click.option("--epochs", default=10, show_default=True, help="Epochs of the 1 ps + 2 workers async run.")
@click.option("--backend", default="numba", show_default=True, type=click.Choice(["numba", "cupy"]),
              help="The workers' kernels. cupy: workers on the GPU against numba workers and one process on the "
                   "GPU, in the same run.")
def train(as_json, epochs, backend):
    """Training: examples/s of real clusters vs one process, ps pull/push vs raw pyzmq."""
    _report("train", as_json, epochs=epochs, backend=backend)


@bench.command()
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON result line.")
@click.option("--num-workers", "ranks", default=2, show_default=True, type=click.IntRange(min=2),
              help="Processes on the ring.")
@click.option("--rounds", default=None, type=click.IntRange(min=1), show_default="50 of 318 KB, 5 of 64 MB",
              help="Timed all-reduces per size.")
def allreduce(as_json, ranks, rounds):
    """All-reduce alone: zmqflow's ring over ZeroMQ vs PyTorch's gloo all-reduce of the same bytes (the MNIST
    MLP's gradient, 64 MB) between processes on this machine; gloo skipped, saying why, without torch."""
    _report("allreduce", as_json, ranks=ranks, rounds=rounds)


@bench.command()
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON result line.")
@click.option("--epochs", default=8, show_default=True, help="Passes over the 5,000 MNIST rows per phase.")
@click.option("--repeats", default=3, show_default=True, help="Runs of each phase; medians are reported.")
@click.option("--rows", "tabular_rows", default=60_000, show_default=True,
              help="Rows of the tabular CSV (40 numeric columns, a categorical, a label) of the data-spec part.")
@click.option("--tabular-epochs", default=2, show_default=True, help="Passes over the tabular CSV per phase.")
@click.option("--train-epochs", "tabular_train_epochs", default=3, show_default=True,
              help="Epochs of the 1 ps + 2 workers training job on the tabular data spec.")
def reader(as_json, epochs, repeats, tabular_rows, tabular_epochs, tabular_train_epochs):
    """Reader: MNIST rows/s from CSV and TFRecord shards into the broker vs parsing alone; a data spec's
    tabular CSV parsed into model inputs vs through the broker, and trained on (under "tabular")."""
    _report("reader", as_json, epochs=epochs, repeats=repeats, tabular_rows=tabular_rows,
            tabular_epochs=tabular_epochs, tabular_train_epochs=tabular_train_epochs)


@bench.command()
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON result line.")
@option("--duration-secs", "duration", old_names=["--duration"],
        default=3.0, show_default=True, help="Seconds of each phase.")
@click.option("--rate", default=500, show_default=True, help="Open-loop requests per second.")
@click.option("--deadline-ms", default=None, type=click.IntRange(1),
              help="The aggregator's deadline with a member killed (default 50); with --overload, every request's "
                   "(default 100).")
@click.option("--profile-dir", default=None, type=click.Path(file_okay=False),
              help="Write the aggregators' cProfile stats here (ZMQFLOW_PROFILE_DIR).")
@click.option("--overload", is_flag=True,
              help="Instead: the aggregator's capacity (open-loop ramp), then 2x capacity for --duration-secs and "
                   "half of it after: goodput / capacity, shed share, p50/p99, recovery time; and the same without "
                   "shedding.")
@click.option("--rows", default=8, show_default=True, type=click.IntRange(1),
              help="--overload: rows per request.")
@click.option("--hidden", default=1024, show_default=True, type=click.IntRange(1),
              help="--overload: the members' MLP has two hidden layers this wide (100: the shipped one-layer MLP), so "
                   "that the model servers, not the load generator on the same cores, set the capacity.")
@click.option("--concurrency", default=2, show_default=True, type=click.IntRange(min=1),
              help="Closed-loop clients of the gateway (REST and gRPC) vs ZeroMQ comparison.")
def serve(as_json, duration, rate, deadline_ms, profile_dir, overload, rows, hidden, concurrency):
    """Serving: one model server direct vs an aggregator over 3 (open loop) vs one server hosting the 3
    checkpoints combined in process (the in-process ensemble), with one member killed, and the
    gateway (REST JSON, REST binary and, with the grpc extra, gRPC) against the ZeroMQ path at the same
    closed-loop load (with the http extra), and the gateway + one model server against MLServer under wrk
    (MLServer on PATH or named by ZMQFLOW_BENCH_MLSERVER; else skipped, with the command that compares);
    or, with --overload, the aggregator over its capacity."""
    from zmqflow.bench.serve import run, run_overload

    progress = None if as_json else click.echo
    if overload:
        result = run_overload(seconds=duration, deadline_ms=deadline_ms or 100, rows=rows, hidden=hidden,
                              progress=progress)
    else:
        result = run(seconds=duration, rate=rate, deadline_ms=deadline_ms or 50, profile_dir=profile_dir,
                     progress=progress, concurrency=concurrency)
    click.echo(json.dumps(result))


@bench.command()
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON result line.")
@click.option("--role", "roles", multiple=True, type=click.Choice(["broker", "ps", "reader", "worker", "serve",
                                                                   "aggregator", "gateway"]),
              help="Measure this role (repeat); its dependencies are started too. Default: every role.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(min=1), help="Starts of each role.")
@click.option("--settle-secs", "settle_s", default=1.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds a task idles after it is ready before its RSS is read.")
@click.option("--backend", default=DEFAULT_BACKEND, show_default=True, type=click.Choice(["numpy", "numba"]),
              help="The worker's and model server's --backend.")
def startup(as_json, roles, rounds, settle_s, backend):
    """Start-up and memory of every role: exec to ready (its healthcheck: ping, HTTP ready, first enqueue, first
    step) and RSS at rest, against a bare `python -c "import zmq, numpy"` (targets: <= 1 s, <= 150 MB)."""
    from zmqflow.bench.startup import ROLES
    _report("startup", as_json, roles=roles or ROLES, rounds=rounds, settle_s=settle_s, backend=backend)


def _counts(ctx, param, value):
    try:
        counts = tuple(int(v) for v in value.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise click.BadParameter(f"{value!r}: comma-separated counts of 1 or more, e.g. 1,2,4")
    return counts


@bench.command()
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON result line.")
@click.option("--num-ps", default="1,2,4", show_default=True, callback=_counts, help="ps shard counts of the grid.")
@click.option("--num-workers", default="1,2,4,8", show_default=True, callback=_counts,
              help="Worker counts of the grid.")
@click.option("--models", default="mlp,cnn,embedding", show_default=True,
              help="Of mlp (the MNIST MLP), cnn (the tutorial CNN), embedding (examples/sparse_embedding.py).")
@click.option("--bandwidth", default="1gbit,10gbit", show_default=True,
              help="Link rates (tc's units: 100mbit, 1gbit, 10gbit), comma-separated: the grid runs at each.")
@click.option("--delay-secs", "delay_secs", default=0.0001, show_default=True, type=click.FloatRange(min=0),
              help="Latency each shaped link adds to what it sends (netem): 0.0001 is 0.1 ms; 0 adds none.")
@click.option("--duration-secs", "seconds", default=3.0, show_default=True, type=click.FloatRange(min=0.2),
              help="Measured seconds of each point, once its workers train.")
@click.option("--plot", "plot_path", default=None, type=click.Path(dir_okay=False),
              help="Write a PNG of examples/s against workers here (matplotlib: the plot or test extra).")
def scaling(as_json, num_ps, num_workers, models, bandwidth, delay_secs, seconds, plot_path):
    """The ps:worker ratio and bandwidth study: a job per model x bandwidth x ps x workers, each task in a
    network namespace of its own with its link shaped (htb, netem); examples/s, bytes per step per link, link
    and CPU use, and where the ps saturates (the knee). Root only: exits 2 saying why otherwise."""
    from zmqflow.bench.scaling import run
    from zmqflow.common.errors import InvalidArgumentError, UnavailableError

    try:
        result = run(num_ps=num_ps, num_workers=num_workers, models=tuple(m.strip() for m in models.split(",")),
                     bandwidths=tuple(b.strip() for b in bandwidth.split(",")), delay_ms=delay_secs * 1000, seconds=seconds,
                     plot_path=plot_path, progress=None if as_json else click.echo)
    except (InvalidArgumentError, UnavailableError) as error:
        click.echo(f"zmqflow bench scaling: {error}", err=True)
        raise SystemExit(2) from None
    click.echo(json.dumps(result))
