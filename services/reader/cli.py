"""`zmqflow-reader` / `zmqflow reader` / `python -m zmqflow.services.reader`: one reader process of an input pipeline.

    zmqflow reader --broker tcp://127.0.0.1:5555 --preset mnist-csv --num-epochs 2 --num-readers 2
    zmqflow reader --broker ... --files 'shards/*.csv' --format csv \\
        --format-options '{"record_defaults": [[0.0], [0.0], [0]], "skip_header_lines": 1}' --queue train
    zmqflow reader --broker ... --data-config data-config.json --split train --queue train --num-epochs 5

Presets (PRESETS) describe the files shipped in data/ so that every format ends
in the same instance queue the workers expect: `image` float32 [784] in [0, 1]
and `label` int32. `--data-config` (a data spec and its train-split statistics, as
data_spec.to_config writes them) streams the spec's files as the model's prepared inputs
and `label` (inputs/spec_stream.py), into the queue the workers of `zmqflow train --data` read.
Launchers render a job's readers from its JobSpec (jobs/spec.py) and pass them `--config TASK.json`
(jobs/local_cluster.py's `start_readers` starts several of any options).
"""

import json
import os
import signal
import sys

import click

from zmqflow.common.rpc import health
from zmqflow.common.processes.service_cli import (curve_option, ops_options, option, serve_metrics, service_main,
                                                  setup_logging, task_config_option)
from zmqflow.inputs.datasets import DATA_DIR, RECORD_FORMAT
from zmqflow.common.errors import INVALID_ARGUMENT, OpError
from zmqflow.common.memory import keep_freed_memory
from zmqflow.common.clients.producers import DEFAULT_LEASE_S, DEFAULT_REJOIN_S
from zmqflow.inputs.formats import FORMATS
from zmqflow.services.reader.reading import DATA_SPEC, DEFAULT_ENQUEUE_TIMEOUT, QUEUE_KINDS

_MNIST = {"features": ["image", "label"]}
PRESETS = {
    "mnist-csv": {**_MNIST, "format": "csv", "files": [os.path.join(DATA_DIR, "mnist_5k.csv.gz")],
                  "options": {"record_defaults": [[0.0]] * 784 + [[0]],
                              "columns": {"image": list(range(784)), "label": 784}, "scale": {"image": 1 / 255}}},
    "mnist-tfrecord": {**_MNIST, "format": "tfrecord", "files": [os.path.join(DATA_DIR, "mnist_sample-*.tfrecord*")],
                       "options": {"features": {"image": {"shape": [784], "dtype": "float32"},
                                                "label": {"shape": [], "dtype": "int32"}}}},
    "mnist-fixed": {**_MNIST, "format": "fixed_length", "files": [os.path.join(DATA_DIR, "mnist_sample.bin")],
                    "options": {"record_bytes": 785, "header_bytes": 4, "footer_bytes": 2,
                                "fields": [["label", "uint8", 0], ["image", "uint8", 1, [784]]],
                                "scale": {"image": 1 / 255}},
                    "cast": {"label": "int32"}},
    # The training split as written by `zmqflow data mnist-shards --out DIR`: no default files (--files 'DIR/*.bin').
    "mnist-shards": {**_MNIST, "format": "fixed_length", "options": {**RECORD_FORMAT, "chunk_size": 500},
                     "cast": {"label": "int32"}},
}


def resolve_input(preset=None, format_kind=None, format_options=None, files=(), features=None, cast=None,
                  chunk_size=None, skip_bad_rows=False):
    """(format kind, format options, files, features, cast): a preset, overridden by what is given."""
    base = PRESETS[preset] if preset else {}
    kind = format_kind or base.get("format")
    if kind is None:
        raise click.UsageError("give --format (csv, fixed_length, tfrecord) or --preset")
    options = dict(base.get("options", {})) if kind == base.get("format") else {}
    options.update(format_options or {})
    if chunk_size is not None:
        options["chunk_size"] = chunk_size
    if skip_bad_rows:
        if kind != "csv":
            raise click.UsageError("--skip-bad-rows applies to the csv format only")
        options["skip_bad_rows"] = True
    files = list(files) or base.get("files", [])
    if not files:
        hint = (" (write them with `zmqflow data mnist-shards --out DIR`, then --files 'DIR/*.bin')"
                if preset == "mnist-shards" else "")
        raise click.UsageError(f"no input files: give --files GLOB{hint}" if not preset else
                               f"--preset {preset} has no default files: give --files GLOB{hint}")
    return (kind, options, files, list(features) if features else base.get("features"),
            {**base.get("cast", {}), **(cast or {})})


def resolve_data_spec(data_config, split="train", chunk_size=None):
    """(format kind, options, files, features) of a data spec's split from its --data-config file (spec +
    statistics); a split drawn by fractions is drawn here, once, so every reader thread keeps the same
    rows. A config `zmqflow data prepare` wrote names its prepared shards: the train split is read from
    them (fixed-length records of the model's inputs and label), with no parsing."""
    from zmqflow.common.errors import InvalidArgumentError
    from zmqflow.common.spec_files import read_spec_file
    from zmqflow.inputs.data_spec import from_config
    from zmqflow.inputs.spec_stream import split_files, split_rows
    config = read_spec_file(data_config, "--data-config")
    try:
        spec = from_config(config)
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidArgumentError(f"--data-config {data_config}: not a data spec with its statistics "
                                   f"(the JSON data_spec.to_config writes): {exc}") from None
    shards = config.get("shards")
    if shards and split == "train":
        options = {**shards["options"], **({"chunk_size": chunk_size} if chunk_size is not None else {})}
        return shards["format"], options, [shards["files"]], [field[0] for field in shards["options"]["fields"]]
    options = {"config": config, "split": split, "rows": split_rows(spec, split)}
    if chunk_size is not None:
        options["chunk_size"] = chunk_size
    return DATA_SPEC, options, split_files(spec, split), None


def _parse_cast(values):
    cast = {}
    for item in values:
        name, sep, dtype = item.partition("=")
        if not sep or not name or not dtype:
            raise click.BadParameter(f"{item!r}: expected NAME=DTYPE, e.g. label=int32", param_hint="--cast")
        cast[name] = dtype
    return cast


def _tf_config_task():
    """(name, broker endpoint or None) from TF_CONFIG: task type 'reader' names the member reader:<index>,
    and a 'broker' job in the cluster gives the broker's address."""
    from zmqflow.common.cluster.spec import ClusterSpec
    task = ClusterSpec.from_tf_config()
    if task is None:
        return "reader", None
    broker = task.cluster.endpoint("broker", task.cluster.task_indices("broker")[0]) \
        if "broker" in task.cluster.jobs else None
    name = f"reader:{task.task_index}" if task.task_type == "reader" else "reader"
    return name, broker


@click.command(name="reader", context_settings={"show_default": True})
@task_config_option()
@curve_option()
@click.option("--broker", default=None, envvar="ZMQFLOW_BROKER",
              help="The queue-broker endpoint. Default: $ZMQFLOW_BROKER, else the 'broker' job of TF_CONFIG.")
@click.option("--files", "file_patterns", multiple=True, metavar="GLOB",
              help="Input files (a glob; repeat). Default: the preset's files in data/.")
@click.option("--preset", type=click.Choice(sorted(PRESETS)), default=None,
              help="Format, options and files of the MNIST samples in data/: image float32 [784] in [0,1], "
                   "label int32.")
@click.option("--format", "format_kind", type=click.Choice(sorted(FORMATS)), default=None,
              help="File format (overrides the preset's).")
@click.option("--format-options", default=None, metavar="JSON",
              help='Options of the format as JSON, merged over the preset\'s, e.g. \'{"skip_header_lines": 1}\' '
                   "(see services/reader/formats).")
@click.option("--data-config", default=None, type=click.Path(dir_okay=False),
              help="Stream a data spec instead: its spec and train-split statistics as JSON (what `zmqflow train "
                   "--data` records). Instances are the model's prepared inputs and `label`; CSV specs only; bad "
                   "rows fail or are skipped as the spec's skip_bad_rows says.")
@click.option("--split", default="train", type=click.Choice(["train", "validation", "test"]),
              help="With --data-config: the split to stream.")
@click.option("--features", multiple=True, metavar="NAME",
              help="Features to enqueue, in queue order (repeat). Default: the preset's, else every feature.")
@click.option("--cast", "cast_values", multiple=True, metavar="NAME=DTYPE", help="Cast a feature before enqueueing.")
@click.option("--num-epochs", default=1, help="Passes over the files; 0 = forever (the queue never closes).")
@click.option("--shuffle-files/--no-shuffle-files", default=True,
              help="Shuffle the file names every epoch (string_input_producer's shuffle).")
@click.option("--seed", default=None, type=int, help="Seed of the file shuffle and of the shuffle queue.")
@option("--num-readers", "readers", old_names=["--readers"],
        default=1, help="Reader threads in this process (parsing holds the GIL: for more cores "
                                     "run more reader processes on the same --queue).")
@click.option("--queue", "queue_name", default="train", help="shared_name of the instance queue (and the pipeline's).")
@click.option("--queue-kind", type=click.Choice(QUEUE_KINDS), default="shuffle",
              help="RandomShuffleQueue, FIFOQueue, or PaddingFIFOQueue (variable-length features).")
@click.option("--capacity", default=10_000, help="Capacity of the instance queue.")
@click.option("--min-after-dequeue", default=None, type=int, help="Shuffle queue: default capacity / 2.")
@click.option("--chunk-size", default=None, type=int,
              help="Instances per enqueue_many (the format's default: 256; 1024 with --data-config).")
@click.option("--in-flight", default=2, help="enqueue_many requests a reader thread keeps outstanding while it "
                                             "parses the next chunk.")
@option("--skip-bad-rows", "skip_bad_rows", old_names=["--skip-malformed"],
        is_flag=True, help="CSV: skip and count malformed lines instead of failing.")
@click.option("--container", default="", help="Resource container of the pipeline's queues.")
@option("--heartbeat-timeout-secs", "lease_s", old_names=["--lease"], default=DEFAULT_LEASE_S,
        help="Seconds without a beat after which the broker takes this reader as gone and fails the pipeline.")
@click.option("--at-least-once", is_flag=True,
              help="Take file names with a lease (extended while the file is read), acked once the file is in the "
                   "instance queue: a reader killed mid-file gives its name back and the file is read again by "
                   "another (or a restarted) reader, its rows arriving twice, instead of failing the pipeline. "
                   "Every reader of the pipeline must pass it. See docs/queues.md.")
@option("--rejoin-wait-secs", "rejoin_s", old_names=["--rejoin-wait"],
        default=DEFAULT_REJOIN_S, type=click.FloatRange(0, min_open=True),
        help="With --at-least-once: seconds the broker waits for a reader to join again when every reader "
             "died with input left, before it fails the pipeline (the first reader's value counts).")
@option("--enqueue-timeout-secs", "enqueue_timeout", old_names=["--enqueue-timeout"], default=DEFAULT_ENQUEUE_TIMEOUT,
        help="Seconds one chunk may wait for room in the instance queue before the pipeline fails.")
@option("--progress-every-secs", "progress_every", old_names=["--progress-every"],
        default=10.0, help="Seconds between progress lines (0: none).")
@option("--json-out", "stats_file", old_names=["--stats-file"], default=None, type=click.Path(dir_okay=False),
        help="Write this reader's summary as JSON here at exit.")
@click.option("--name", default=None, help="Producer name on the broker (default: reader, or reader:<index> "
                                           "from TF_CONFIG); the host and pid are appended.")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
@ops_options
def command(broker, file_patterns, preset, format_kind, format_options, data_config, split, features, cast_values,
            num_epochs, shuffle_files, seed, readers, queue_name, queue_kind, capacity, min_after_dequeue, chunk_size,
            in_flight, skip_bad_rows, container, lease_s, at_least_once, rejoin_s, enqueue_timeout,
            progress_every, stats_file, name, log_level):
    """Read files into the broker's instance queue: one reader process of an input pipeline.

    The first reader process to join a pipeline expands the globs and feeds the
    file names (NUM_EPOCHS passes, shuffled per epoch) into QUEUE.filenames;
    every reader thread of every reader process on the same --queue takes names
    from it and pushes the file's instances with enqueue_many. A reader reads
    only the files of its own --files (expanded at start): any other name in
    that queue fails the pipeline with PermissionDenied, unopened
    (docs/security.md), so give every reader process the same files. Each reader
    process is a registered producer of the instance queue: the broker closes it
    once the last one is done, so consumers get every instance and then
    OutOfRange. A reader that dies mid-file (its connection drops, or it stops
    beating for --heartbeat-timeout-secs) fails the pipeline: consumers get an
    AbortedError naming it and its file (docs/queue-semantics.md §8); with
    --at-least-once its file is read again instead.

    With --data-config the files, format and components come from a data spec:
    each chunk of rows is made into the model's inputs and `label` with the
    recorded statistics; a bad row (or a label outside the classes) fails the
    pipeline naming its file, line and column, unless the spec skips bad rows.

    Exits 0 when the pipeline closed or this reader was stopped (SIGTERM or
    SIGINT: between files it leaves quietly, mid-file it fails the pipeline with
    CancelledError); 2 for bad options or input (files that are not there, a bad
    row found while it runs, by this reader or another of the pipeline); 3 when
    the broker was lost; 1 when the pipeline failed otherwise. TF_CONFIG: task
    type 'reader' names the member reader:<index>; a 'broker' job gives the
    broker's address.
    """
    from zmqflow.services.reader.reading import ReaderPipeline

    health.announce(health.CLIENT)

    tf_name, tf_broker = _tf_config_task()
    broker = broker or tf_broker
    if not broker:
        raise click.UsageError("no broker: pass --broker, set ZMQFLOW_BROKER, or a 'broker' job in TF_CONFIG")
    options = None
    if format_options:
        try:
            options = json.loads(format_options)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--format-options") from None
    if data_config and (preset or format_kind or options or file_patterns or features or cast_values
                        or skip_bad_rows):
        raise click.UsageError("--data-config gives the files, format and features: drop --preset, --format, "
                               "--format-options, --files, --features, --cast and --skip-bad-rows (the spec's "
                               "skip_bad_rows decides)")
    if not data_config:
        kind, options, files, features, cast = resolve_input(preset, format_kind, options, file_patterns, features,
                                                             _parse_cast(cast_values), chunk_size, skip_bad_rows)
    name = name or tf_name
    setup_logging(log_level, name)
    keep_freed_memory()
    try:   # before anything runs: an error here is in the options or the input (no broker is asked yet)
        if data_config:
            (kind, options, files, features), cast = resolve_data_spec(data_config, split, chunk_size), {}
        pipeline = ReaderPipeline(broker, files, kind, options, queue=queue_name, container=container,
                                  queue_kind=queue_kind, capacity=capacity, min_after_dequeue=min_after_dequeue,
                                  seed=seed, num_epochs=num_epochs or None, shuffle_files=shuffle_files,
                                  readers=readers, features=features, cast=cast, lease_s=lease_s,
                                  enqueue_timeout=enqueue_timeout, in_flight=in_flight,
                                  name=name, progress_every=progress_every, at_least_once=at_least_once,
                                  rejoin_s=rejoin_s)
    except OpError as exc:
        summary = _failed(exc, bad_input=True)
    else:
        from zmqflow.common.processes import metrics
        if metrics.requested():  # --metrics-bind
            metrics.set_task(name, "reader")
            metrics.register(lambda: pipeline.counters.metric_families(name))
            serve_metrics()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: pipeline.request_stop(signal.Signals(signum).name))
        try:
            summary = pipeline.run()
        except OpError as exc:
            summary = _failed(exc)
    if stats_file:
        tmp = f"{stats_file}.tmp"
        with open(tmp, "w") as f:
            json.dump(summary, f)
        os.replace(tmp, stats_file)
    if summary["outcome"] in ("failed", "error") and not summary.get("stopped"):
        sys.exit(exit_code(summary))


def _failed(exc, bad_input=False):
    """The summary of a reader that could not run its part (said on stderr, one line: `Error:` as click says
    it for bad input)."""
    click.echo(f"{'Error' if bad_input else 'reader'}: {type(exc).__name__}: {exc}", err=True)
    return {"outcome": "error", "error": f"{type(exc).__name__}: {exc}", "code": exc.code, "bad_input": bad_input,
            "peer_lost": type(exc).__name__ == "UnavailableError"}


def exit_code(summary):
    """A failed reader's exit code (V6, docs/cli.md): 2 bad options or input (a bad row: the pipeline failed
    INVALID_ARGUMENT, by this reader or another), 3 the broker was lost (deploy/README.md), 1 anything else."""
    if summary.get("bad_input") or summary.get("code") == INVALID_ARGUMENT:
        return 2
    return 3 if summary.get("peer_lost") else 1


def main():
    service_main(command)


if __name__ == "__main__":
    main()
