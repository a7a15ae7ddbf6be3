"""A data spec's split as a stream of prepared chunks: what a reader process pushes into the instance queue.

    spec = from_config(read_spec_file("data-config.json"))        # spec + train-split statistics
    components = queue_components(spec)          # [("input", "float32", [61]), ("label", "int32", [])]
    stream = SpecStream(config, split="train", rows=split_rows(spec, "train"))
    for chunk in stream.read(path):              # Chunk({"input": [n, 61], "label": [n]}, n, path, start)
        ...

The queue declaration (`queue_components`) is one function so that every feeder of a spec
(the launcher's thread, reader processes) declares the same queue the workers attach to.

Only CSV streams: each file goes through CsvFormat a chunk of lines at a time, configured as
data_spec's CSV reader configures it (the header names the columns, empty fields take the
feature's default, `skip_bad_rows` skips and counts malformed lines), and every chunk becomes
model inputs and labels with the recorded statistics (model_inputs / labels on a Table of the
chunk, so a bad label names its file and line). Other formats (npz, the shipped mnist) are
read whole by data_spec and fed from memory.

A split drawn by seeded fractions (`split: {validation: 0.1}`) has no files of its own:
`split_rows` reads the files once to draw it, as load_tables does, and the stream keeps only
that split's rows of each file, parsing every epoch like any other.
"""

import os

import numpy as np

from zmqflow.common.errors import InvalidArgumentError, check_int
from zmqflow.inputs.data_sources import csv_format, name_columns, needed
from zmqflow.inputs.data_spec import Table, from_config, input_signature, labels, load_tables, model_inputs
from zmqflow.inputs.formats.base import Chunk, Counters

STREAMED_FORMATS = ("csv",)
DEFAULT_CHUNK_SIZE = 1024
FEED_FROM_MEMORY_MAX_BYTES = 256 << 20
"""A job feeds a train split whose prepared rows take at most this from memory, by a thread: its
launcher reads every split anyway (the statistics, the validation and test scores), so a thread
costs no parse per epoch. On 2 cores, 60,000 rows of 61 inputs trained at 50,800 examples/s fed
from memory and 24,500-37,100 fed by a reader process that parses every epoch. Larger splits are
streamed by reader processes, so the launcher does not hold a prepared copy."""


def label_component(spec):
    """(dtype, shape) of one label: a class id, a regressed value, or one 0/1 per tag."""
    task = spec.label.task
    if task in ("multiclass", "binary"):
        return "int32", []
    return "float32", [len(spec.label.columns)] if task == "multi_label" else []


def queue_components(spec):
    """[(name, dtype, shape)] of the instance queue a spec's prepared rows go through: the model's
    inputs (input_signature) and then `label`."""
    components = [(name, dtype, list(shape)) for name, (shape, dtype) in input_signature(spec).items()]
    return components + [("label", *label_component(spec))]


def split_files(spec, split):
    """The file patterns a split's rows are in: its own, or the train files when fractions draw it."""
    drawn = _drawn_splits(spec)
    if split in drawn:
        return list(spec.files["train"])
    if split not in spec.files:
        raise InvalidArgumentError(f"data spec {spec.name!r} has no {split} split; it has "
                                   f"{', '.join(sorted(drawn | set(spec.files)))}")
    return list(spec.files[split])


def split_rows(spec, split):
    """{real path: sorted row indices in the file} of a split drawn by fractions (None for a split with
    its own files): the files are read once, as load_tables draws the split."""
    if split not in _drawn_splits(spec):
        return None
    table = load_tables(spec)[split]
    header = 1 if spec.header else 0
    rows = {}
    for index, path in enumerate(table.files):
        lines = table.origins[table.origins[:, 0] == index, 1]
        rows[os.path.realpath(path)] = np.sort(lines - 1 - header)
    return rows


def _drawn_splits(spec):
    """The splits seeded fractions draw from the train files (none without `split:`)."""
    if not spec.split:
        return set()
    return {"train"} | {part for part in ("validation", "test") if spec.split.get(part)}


class SpecStream:
    """Prepared chunks of a data spec's files: the reader pipeline's format object for `--data-config`
    (`spec`, `read(path)`, `counters`, as inputs/formats' formats)."""

    kind = "data_spec"

    def __init__(self, config, split="train", rows=None, chunk_size=DEFAULT_CHUNK_SIZE):
        self.data = from_config(config)
        if self.data.format not in STREAMED_FORMATS:
            raise InvalidArgumentError(f"data spec {self.data.name!r}: readers stream {', '.join(STREAMED_FORMATS)} "
                                       f"files; a {self.data.format} spec is fed from memory")
        check_int("chunk_size", chunk_size, 1)
        self.split, self.rows, self.chunk_size = split, rows, chunk_size
        self.components = queue_components(self.data)
        self.counters = Counters()

    @property
    def spec(self):
        """Component name -> (dtype, shape) per instance, as the formats give it."""
        return {name: (dtype, tuple(shape)) for name, dtype, shape in self.components}

    def read(self, path):
        """Chunks of at most `chunk_size` prepared rows of `path` (only the split's, with `rows`)."""
        path = os.fspath(path)
        names, fmt = csv_format(self.data, path, chunk_size=self.chunk_size)
        fmt.counters = self.counters   # one tally over every file this stream reads
        kinds = needed(self.data)
        wanted = None if self.rows is None else self.rows.get(os.path.realpath(path), np.empty(0, np.int64))
        header = 1 if self.data.header else 0
        try:
            for chunk in fmt.read(path):
                index = chunk.start + np.arange(chunk.count)
                columns = {c: chunk.features[str(c)] for c in kinds}
                if wanted is not None:
                    keep = np.isin(index, wanted, assume_unique=True)
                    if not keep.all():
                        index, columns = index[keep], {c: v[keep] for c, v in columns.items()}
                    if not len(index):
                        continue
                origins = np.stack([np.zeros(len(index), np.int64), index + 1 + header], axis=1)
                table = Table(columns, [path], origins)
                x = model_inputs(self.data, table)
                features = dict(x) if isinstance(x, dict) else {"input": x}
                features["label"] = labels(self.data, table)
                yield Chunk(features, len(index), path, int(index[0]))
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(name_columns(str(exc), names)) from None
