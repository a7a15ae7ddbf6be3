"""`zmqflow bench reader`: MNIST rows from files into the broker's instance queue, against parsing alone;
and a data spec's tabular CSV the same way, plus a training job on it (bench/reader_tabular.py, "tabular").

Cuts data/mnist_5k.csv.gz into 8 temporary CSV shards (and the same rows into 8
TFRecord shards), starts a broker, and for each phase starts reader processes
(`zmqflow reader`, one reader thread each) on a FIFO instance queue that this
process drains with dequeue_up_to until OutOfRange. A phase's rate counts the
instances received after the first batch, over the time from that batch to
OutOfRange, so process start-up is left out.

Baseline, in the same run: the same CSV shards parsed by the same format object
in this process with no broker (`parse_only_instances_per_s`), and numpy's own
loadtxt of the same rows (`numpy_loadtxt_instances_per_s`). Every phase runs
`repeats` times and reports its median; `reader_vs_parse` is csv_1r / parse_only
(both scale pixels to [0, 1]); `parse_vs_numpy_loadtxt` compares parsing itself
(`parse_unscaled_instances_per_s`, no /255) with loadtxt, which does not scale.
"""

import glob
import gzip
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

from zmqflow.inputs.datasets import MNIST_CSV
from zmqflow.common.errors import OutOfRangeError
from zmqflow.common.processes.children import compute_thread_env, start_service
from zmqflow.common.clients.queues import attach
from zmqflow.jobs.local_cluster import start_readers
from zmqflow.services.reader.cli import PRESETS
from zmqflow.inputs.formats import open_format, write_tfrecord

SHARDS = 8
DRAIN = 100  # a worker's mini-batch


def make_shards(directory, shards=SHARDS):
    """(csv glob, tfrecord glob, rows): the MNIST rows cut into contiguous CSV and TFRecord shards."""
    with gzip.open(MNIST_CSV) as f:
        lines = f.read().splitlines(keepends=True)
    table = np.loadtxt(lines, delimiter=",", dtype=np.float32)
    for i, rows in enumerate(np.array_split(np.arange(len(lines)), shards)):
        with open(os.path.join(directory, f"mnist-{i}.csv"), "wb") as f:
            f.writelines(lines[r] for r in rows)
        write_tfrecord(os.path.join(directory, f"mnist-{i}.tfrecord"),
                       ({"image": table[r, :784] / 255, "label": int(table[r, 784])} for r in rows))
    return os.path.join(directory, "mnist-*.csv"), os.path.join(directory, "mnist-*.tfrecord"), len(lines)


def parse_only(pattern, preset, epochs, scale=True):
    """Instances/s of one format object reading the shards `epochs` times, no broker. Without
    `scale` it is parsing itself (no /255), the job numpy.loadtxt does in the baseline."""
    options = dict(PRESETS[preset]["options"])
    if not scale:
        options.pop("scale", None)
    fmt = open_format(PRESETS[preset]["format"], **options)
    files = sorted(glob.glob(pattern))
    start, count = time.perf_counter(), 0
    for _ in range(epochs):
        for path in files:
            for chunk in fmt.read(path):
                count += chunk.count
    return count / (time.perf_counter() - start)


def numpy_loadtxt(pattern):
    files = sorted(glob.glob(pattern))
    start, count = time.perf_counter(), 0
    for path in files:
        count += len(np.loadtxt(path, delimiter=",", dtype=np.float32))
    return count / (time.perf_counter() - start)


def through_broker(broker, pattern, preset, readers, epochs, queue, log_dir, **source):
    """Instances/s from `readers` reader processes into a FIFO queue drained here; checks the count.
    `source`: other reader options instead of the files and preset (data_config=...)."""
    source = source or {"files": [pattern], "preset": preset}
    procs = start_readers(broker, processes=readers, log_dir=log_dir, env=compute_thread_env(1), queue=queue,
                          queue_kind="fifo", capacity=20_000, num_epochs=epochs, progress_every=0, **source)
    try:
        q = attach(queue, broker=broker, timeout=60)
        first = q.dequeue_up_to(DRAIN, timeout=60)
        start, count, total = time.perf_counter(), 0, len(first["label"])
        while True:
            try:
                batch = q.dequeue_up_to(DRAIN, timeout=60)
            except OutOfRangeError:
                break
            count += len(batch["label"])
        elapsed = time.perf_counter() - start
        total += count
        codes = [p.proc.wait(60) for p in procs]
        if any(codes):
            raise RuntimeError(f"reader exit codes {codes}:\n{procs[codes.index(max(codes))].log()[-2000:]}")
        return count / elapsed, total
    finally:
        for p in procs:
            p.stop()


def run(epochs=8, repeats=3, progress=None, tabular_rows=60_000, tabular_epochs=2, tabular_train_epochs=3):
    """The MNIST result, with the tabular part (bench/reader_tabular.py) under "tabular"."""
    from zmqflow.bench import reader_tabular
    say = progress or (lambda *_: None)
    work = tempfile.mkdtemp(prefix="zmqflow-bench-reader-")
    broker = None
    try:
        csv_glob, tfrecord_glob, rows = make_shards(work)
        broker = start_service("zmqflow.services.broker", log_dir=work)
        samples = {"csv_1r": [], "csv_2r": [], "tfrecord_1r": [], "parse_only": [], "parse_unscaled": [],
                   "numpy_loadtxt": []}
        for rep in range(repeats):
            samples["parse_only"].append(parse_only(csv_glob, "mnist-csv", epochs))
            samples["parse_unscaled"].append(parse_only(csv_glob, "mnist-csv", 2, scale=False))
            samples["numpy_loadtxt"].append(numpy_loadtxt(csv_glob))
            for key, pattern, preset, readers in (("csv_1r", csv_glob, "mnist-csv", 1),
                                                  ("csv_2r", csv_glob, "mnist-csv", 2),
                                                  ("tfrecord_1r", tfrecord_glob, "mnist-tfrecord", 1)):
                rate, total = through_broker(broker.endpoint, pattern, preset, readers, epochs,
                                             f"bench-{key}-{rep}", work)
                if total != rows * epochs:
                    raise RuntimeError(f"{key}: {total} instances delivered, expected {rows * epochs}")
                samples[key].append(rate)
            say(f"repeat {rep + 1}/{repeats}: " + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in samples.items()))
        tabular = reader_tabular.run(work, broker.endpoint, through_broker, rows=tabular_rows, epochs=tabular_epochs,
                                     repeats=repeats, train_epochs=tabular_train_epochs, say=say)
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    median = {k: statistics.median(v) for k, v in samples.items()}
    return {"csv_instances_per_s_1r": round(median["csv_1r"]), "csv_instances_per_s_2r": round(median["csv_2r"]),
            "tfrecord_instances_per_s_1r": round(median["tfrecord_1r"]),
            "parse_only_instances_per_s": round(median["parse_only"]),
            "numpy_loadtxt_instances_per_s": round(median["numpy_loadtxt"]),
            "reader_vs_parse": round(median["csv_1r"] / median["parse_only"], 3),
            "parse_unscaled_instances_per_s": round(median["parse_unscaled"]),
            "parse_vs_numpy_loadtxt": round(median["parse_unscaled"] / median["numpy_loadtxt"], 3),
            "rows": rows, "epochs": epochs, "shards": SHARDS, "repeats": repeats, "cpus": os.cpu_count(),
            "samples": {k: [round(x) for x in v] for k, v in samples.items()}, "tabular": tabular}
