"""The tabular part of `zmqflow bench reader`: a data spec's CSV streamed as prepared rows.

A seeded CSV (default 60,000 rows: 40 numeric columns, a categorical `city` of 20 values, a
3-class label) in a temporary directory, described by a data spec fitted on it. Measured in
the same run:

- parse only: the spec's stream (inputs/spec_stream.py) turning the file into prepared model
  inputs and labels in this process, no broker (`parse_only_instances_per_s`);
- through the broker: one `zmqflow reader --data-config` process into a FIFO queue that this
  process drains 100 rows at a time (`broker_instances_per_s_1r`; start-up left out as in the
  MNIST part), and `broker_vs_parse`, their ratio;
- training: 1 ps + 2 workers with the built-in MLP fitted to the spec
  (`zmqflow.local_cluster(data=spec, model="mlp")`), the job's examples/s and how its train split
  was fed (`train_feed`: readers when the job's log holds their summaries; a split this small is
  fed from memory), and the same job fed by a reader process (`train_examples_per_s_readers`).
"""

import json
import os
import statistics

import numpy as np

from zmqflow.inputs.data_spec import fit, load_spec, load_tables, to_config
from zmqflow.inputs.spec_stream import SpecStream

NUMERIC = 40
CITIES = 20
CLASSES = 3


def write_tabular(directory, rows=60_000, seed=0):
    """(spec dict, csv path): `rows` seeded rows; the label depends on three numerics and the city."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, NUMERIC)) * rng.uniform(0.5, 3, NUMERIC) + rng.uniform(-5, 5, NUMERIC)
    city = rng.integers(0, CITIES, rows)
    score = x[:, :CLASSES] / x[:, :CLASSES].std(axis=0) + rng.normal(0, 0.5, (rows, CLASSES))
    score[np.arange(rows), city % CLASSES] += 1.0
    label = score.argmax(axis=1)
    path = os.path.join(directory, "tabular.csv")
    numbers = np.char.mod("%.4f", x)
    with open(path, "w") as f:
        f.write(",".join([f"x{i}" for i in range(NUMERIC)] + ["city", "label"]) + "\n")
        f.writelines(",".join(row) + f",c{c},k{y}\n" for row, c, y in zip(numbers.tolist(), city, label))
    spec = {"name": "bench-tabular", "files": path,
            "features": {**{f"x{i}": "numeric" for i in range(NUMERIC)},
                         "city": {"type": "categorical", "vocabulary": [f"c{i}" for i in range(CITIES)]}},
            "label": {"column": "label", "task": "multiclass"}}
    return spec, path


def fitted_config(spec_dict):
    """The spec fitted on its rows, as the JSON a job records (to_config)."""
    spec = load_spec(spec_dict)
    fit(spec, load_tables(spec)["train"])
    return to_config(spec)


def parse_only(config, path, epochs):
    """Instances/s of the spec's stream over the file `epochs` times, in this process."""
    import time
    stream = SpecStream(config)
    start, count = time.perf_counter(), 0
    for _ in range(epochs):
        for chunk in stream.read(path):
            count += chunk.count
    return count / (time.perf_counter() - start)


def train_rate(spec_dict, epochs, log_dir, readers=False):
    """(examples/s, how the train split was fed) of 1 ps + 2 workers training the MLP on the spec; with
    `readers`, fed by reader processes whatever its size (spec_stream.FEED_FROM_MEMORY_MAX_BYTES set to 0)."""
    import zmqflow
    from zmqflow.inputs import spec_stream
    limit = spec_stream.FEED_FROM_MEMORY_MAX_BYTES
    spec_stream.FEED_FROM_MEMORY_MAX_BYTES = 0 if readers else limit
    try:
        with zmqflow.local_cluster(num_ps=1, num_workers=2, data=spec_dict, model="mlp", epochs=epochs,
                                   log_dir=log_dir) as job:
            summary = job.wait(timeout=600)
    finally:
        spec_stream.FEED_FROM_MEMORY_MAX_BYTES = limit
    fed_by_readers = os.path.exists(os.path.join(log_dir, "reader-0.json"))
    return summary["examples_per_s"], "readers" if fed_by_readers else "thread"


def run(work, broker, through_broker, rows=60_000, epochs=2, repeats=3, train_epochs=3, say=lambda *_: None):
    """The tabular result (JSON-able); `through_broker` is the MNIST part's phase function."""
    spec_dict, path = write_tabular(work, rows)
    config = fitted_config(spec_dict)
    config_path = os.path.join(work, "tabular-config.json")
    with open(config_path, "w") as f:
        json.dump(config, f)
    samples = {"parse_only": [], "broker_1r": []}
    for rep in range(repeats):
        samples["parse_only"].append(parse_only(config, path, epochs))
        rate, total = through_broker(broker, None, None, 1, epochs, f"bench-tabular-{rep}", work,
                                     data_config=config_path)
        if total != rows * epochs:
            raise RuntimeError(f"tabular: {total} instances delivered, expected {rows * epochs}")
        samples["broker_1r"].append(rate)
        say(f"tabular repeat {rep + 1}/{repeats}: parse only {samples['parse_only'][-1]:,.0f}/s, "
            f"through the broker {rate:,.0f}/s")
    examples_per_s, feed = train_rate(spec_dict, train_epochs, os.path.join(work, "train"))
    say(f"tabular training, 1 ps + 2 workers ({feed}): {examples_per_s:,} examples/s")
    examples_per_s_readers, forced = train_rate(spec_dict, train_epochs, os.path.join(work, "train-readers"), True)
    if forced != "readers":
        raise RuntimeError("the job told to stream its split was not fed by reader processes")
    say(f"tabular training fed by a reader process: {examples_per_s_readers:,} examples/s")
    median = {k: statistics.median(v) for k, v in samples.items()}
    return {"rows": rows, "numeric_columns": NUMERIC, "categories": CITIES, "classes": CLASSES, "epochs": epochs,
            "parse_only_instances_per_s": round(median["parse_only"]),
            "broker_instances_per_s_1r": round(median["broker_1r"]),
            "broker_vs_parse": round(median["broker_1r"] / median["parse_only"], 3),
            "train_examples_per_s": examples_per_s, "train_epochs": train_epochs, "train_feed": feed,
            "train_examples_per_s_readers": examples_per_s_readers,
            "samples": {k: [round(x) for x in v] for k, v in samples.items()}}
