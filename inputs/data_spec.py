"""Data specs: what a user's data is, in one small YAML file (or the same dict from Python).

    source: {format: csv, header: true, delimiter: ","}     # csv, npz, npy, tfrecord, fixed_length, parquet
    files: {train: data/train.csv, test: data/test.csv}      # globs or lists per split; or one file and
    split: {validation: 0.1, test: 0.1, seed: 0}             #   a seeded split by fraction
    features:
      age: numeric                                           # float, standardised on the train split
      income: {type: numeric, default: 0}                    # an empty field takes the default
      city: {type: categorical, vocabulary: [paris, rome]}  # one-hot, or ids (encode: ids) for an Embedding
      zip: {type: categorical, hash_buckets: 100}
      pixels: {type: image, columns: "p0..p783", shape: [28, 28, 1], scale: 0.00392156862745098}
    label: {column: species, task: multiclass}               # multiclass | binary | multi_label | regression
    normalize: true

A spec produces the model's input signature: numeric features and one-hot categoricals make
one float vector `input`; a categorical with `encode: ids` is its own int64 input of one id; an
image is its own input of its shape (`input` when it is the only feature). Normalisation
statistics come from the train split and travel with the checkpoint (`stats`), so serving and
evaluation transform inputs as training did. Every bad input is InvalidArgumentError (or
NotFoundError for a missing file) naming the file, line and column (or record, or row).
The files of each format are read in inputs/data_sources.py.
"""

import copy
import dataclasses
import os
from collections.abc import Mapping

import numpy as np

from zmqflow.common.errors import InvalidArgumentError, did_you_mean
from zmqflow.common.spec_files import read_spec_file
from zmqflow.inputs.data_sources import (SOURCES, Table, check_columns, check_source, column_names, concat,  # noqa: F401
                                         paths, read_csv, read_file, read_mnist, read_npz)   # re-exported: Table, readers
from zmqflow.inputs.spec_schema import FEATURE_TYPES, SPLITS, TASKS, check  # noqa: F401  (re-exported)

FORMATS = tuple(SOURCES)
MNIST = {"name": "mnist", "source": {"format": "mnist"}, "files": {"train": "shipped", "test": "shipped"},
         "features": {"image": {"type": "image", "columns": "p0..p783", "shape": [784]}},
         "label": {"column": "label", "task": "multiclass", "classes": list(range(10))}, "normalize": False}
"""The shipped MNIST sample (inputs/datasets.py): 4,500 train and 500 test rows, pixels in [0, 1]."""
BUILTIN = {"mnist": MNIST}


@dataclasses.dataclass
class Feature:
    name: str
    type: str
    columns: list
    default: float = None
    vocabulary: list = None
    hash_buckets: int = None
    encode: str = "one_hot"
    shape: tuple = None
    scale: float = None

    @property
    def width(self):
        """Columns this feature adds to the `input` vector."""
        if self.type == "numeric":
            return 1
        if self.type == "categorical" and self.encode == "one_hot":
            return len(self.vocabulary) + 1 if self.vocabulary is not None else self.hash_buckets
        return 0


@dataclasses.dataclass
class Label:
    columns: list
    task: str
    classes: list = None


class DataSpec:
    """A checked data spec (inputs/spec_schema.py says what a spec may hold); `load_tables(spec)` reads
    its splits, `prepare` makes the model's inputs. A spec without `features` takes every column but
    the label's (and those it drops), typed from its train split the first time its features are
    asked for (infer_features)."""

    def __init__(self, raw, base_dir=".", origin=None):
        checked = check(raw, f"data spec {origin}" if origin else "data spec")
        self.raw, self.base_dir = dict(raw), base_dir
        self.name = checked.name
        self.source = dict(checked.source)
        self.format = self.source.pop("format")      # the format's options (data_sources.SOURCES) stay
        self.header = bool(self.source.get("header", True))
        self.delimiter = self.source.get("delimiter", ",")
        self.column_names = self.source.get("columns")
        self.files = {split: patterns for split, patterns in checked.files.model_dump().items()
                      if patterns is not None}
        self.split = {} if checked.split is None else {     # the keys the spec gives, checked
            k: v for k, v in checked.split.model_dump().items() if k in raw["split"]}
        label = checked.label
        self.label = Label(label.columns, label.task,
                           None if label.classes is None else [_class_key(c) for c in label.classes])
        self.normalize, self.skip_bad_rows = checked.normalize, checked.skip_bad_rows
        self.drop, self.categorical = checked.drop or [], checked.categorical or []
        self.inferred = checked.features is None
        self._features = None if self.inferred else [
            Feature(name, f.type, f.columns, default=f.default, vocabulary=f.vocabulary, hash_buckets=f.hash_buckets,
                    encode=f.encode, shape=None if f.shape is None else tuple(f.shape), scale=f.scale)
            for name, f in checked.features.items()]
        self.stats = None
        self.tables = None      # (the files' signature, the splits as read): load_tables reads once

    @property
    def features(self):
        """The features: the spec's own, or every column but the label's typed from the train split."""
        if self._features is None:
            self._features = infer_features(self)
        return self._features


def _class_key(value):
    """Class values compare as text: '1' in a file and 1 in a spec are one class."""
    text = value.decode() if isinstance(value, bytes) else str(value)
    try:
        number = float(text)
        return str(int(number)) if number.is_integer() else text
    except ValueError:
        return text.strip()


def load_spec(source):
    """A DataSpec from a mapping or a YAML file (paths in it are relative to the file)."""
    if isinstance(source, DataSpec):
        return source
    if isinstance(source, Mapping):
        return DataSpec(source)
    if isinstance(source, str) and source in BUILTIN:
        return DataSpec(BUILTIN[source])
    path = os.fspath(source)
    return DataSpec(read_spec_file(path, "data spec"), base_dir=os.path.dirname(os.path.abspath(path)), origin=path)


# ------------------------------------------------ reading the data

def load_tables(spec):
    """{split: Table} of every split the spec has (the fraction split drawn with its seed). Read once per
    spec object while its files stay as they were (path, size, modification time): a job fits the
    spec, fits the model, then feeds and scores the same splits. A copy of the dict each time, so a
    caller that changes it changes nothing here."""
    signature = _files_signature(spec)
    if spec.tables is None or spec.tables[0] != signature:
        spec.tables = (signature, _read_tables(spec))
    return dict(spec.tables[1])


def _files_signature(spec):
    """What the spec's files are now: a changed file means the splits are read again."""
    if spec.format == "mnist":
        return ()
    found = [p for split, patterns in spec.files.items() for p in paths(spec, patterns, split)]
    return tuple((p, os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in found)


def _read_tables(spec):
    if spec.format == "mnist":
        tables = read_mnist(spec.files)
    else:
        check_columns(spec)
        tables = {split: concat([read_file(spec, p) for p in paths(spec, patterns, split)])
                  for split, patterns in spec.files.items()}
    if spec.split:
        train = tables["train"]
        for part, rows in drawn_rows(spec, len(train)).items():
            tables[part] = train.take(rows)
    return tables


def drawn_rows(spec, count):
    """{split: sorted row indices} that the spec's seeded fractions draw from `count` train rows."""
    order = np.random.default_rng(spec.split.get("seed", 0)).permutation(count)
    start, rows = 0, {}
    for part in ("validation", "test"):
        size = int(round(count * spec.split.get(part, 0)))
        if spec.split.get(part, 0) and size == 0:
            raise InvalidArgumentError(f"data spec split.{part} = {spec.split[part]} of {count} rows leaves "
                                       f"no {part} rows")
        if size:
            rows[part] = np.sort(order[start:start + size])
            start += size
    rows["train"] = np.sort(order[start:])
    return rows


# ------------------------------------------------ every column by name

MAX_INFERRED_VOCABULARY = 1000
"""A text column with more distinct values in the train split is an id or free text, not a category:
a spec that takes every column asks for it to be dropped (or listed with hash_buckets)."""


def infer_features(spec):
    """The features of a spec that lists none: every column of its first train file but the label's
    and `drop`'s, in the file's order. A column whose train-split values are all numbers is numeric
    (an empty field takes the mean of the others); any other, and those `categorical` names, is
    categorical with the train split's values as its vocabulary (an empty field is unknown)."""
    if spec.format == "mnist":
        raise InvalidArgumentError("the built-in mnist spec lists its features")
    names = column_names(spec, paths(spec, spec.files["train"], "train")[0])
    for key in ("drop", "categorical"):
        for column in getattr(spec, key):
            if column not in names:
                raise InvalidArgumentError(f"data spec {key}: column {column!r} is not in the data"
                                           f"{did_you_mean(column, names)} (its columns: {_few_names(names)})")
    missing = [c for c in spec.label.columns if c not in names]
    if missing:
        raise InvalidArgumentError(f"data spec label: column(s) {missing} are not in the data"
                                   f"{did_you_mean(missing[0], names)} (its columns: {_few_names(names)})")
    taken = [c for c in names if c not in spec.label.columns and c not in spec.drop]
    if not taken:
        raise InvalidArgumentError("data spec: the data has no column but the label's (and those dropped) to learn "
                                   f"from (its columns: {_few_names(names)})")
    probe = copy.copy(spec)          # every taken column read as text, empty fields allowed (CSV)
    probe._features = [Feature(str(c), "categorical", [c], default="" if spec.format == "csv" else None,
                               vocabulary=[]) for c in taken]
    text = concat([read_file(probe, p, label=False) for p in paths(spec, spec.files["train"], "train")])
    if spec.split:
        text = text.take(drawn_rows(spec, len(text))["train"])
    return [_typed(spec, column, text.columns[column]) for column in taken]


def _typed(spec, column, values):
    """A numeric feature when every non-empty value is a number (and the spec does not say categorical)."""
    fields = np.char.strip(np.asarray(values, dtype=bytes))
    empty = fields == b""
    if column not in spec.categorical:
        try:
            numbers = fields[~empty].astype(np.float64)
        except ValueError:
            numbers = None
        if numbers is not None and np.isfinite(numbers).all():
            default = (float(numbers.mean()) if len(numbers) else 0.0) if empty.any() else None
            return Feature(str(column), "numeric", [column], default=default)
    vocabulary = sorted({v.decode("utf-8", "replace") for v in np.unique(fields[~empty])}, key=_sort_key)
    if len(vocabulary) > MAX_INFERRED_VOCABULARY:
        raise InvalidArgumentError(f"data spec: column {column!r} holds {len(vocabulary):,} distinct texts in the "
                                   f"train split, too many for a category (at most {MAX_INFERRED_VOCABULARY:,}): drop "
                                   "it (drop: [...]) or list the features with it as {type: categorical, "
                                   "hash_buckets: N}")
    return Feature(str(column), "categorical", [column], default="" if empty.any() else None, vocabulary=vocabulary)


def _few_names(names):
    return ", ".join(map(str, names[:20])) + (f" and {len(names) - 20} more" if len(names) > 20 else "")


def feature_entry(feature):
    """A feature as a spec's `features:` entry (what a checkpoint records of a spec that listed none)."""
    entry = {"type": feature.type, "column": feature.columns[0]}
    for key in ("default", "vocabulary", "hash_buckets"):
        if getattr(feature, key) is not None:
            entry[key] = getattr(feature, key)
    return entry


# ------------------------------------------------ from columns to model inputs

def _hash_bucket(values, buckets):
    import zlib
    return np.array([zlib.crc32(bytes(v)) % buckets for v in values], dtype=np.int64)


def _category_ids(feature, values):
    """Ids of a categorical column: the vocabulary index (len(vocabulary) for an unknown value) or the hash bucket."""
    if feature.hash_buckets is not None:
        return _hash_bucket(values, feature.hash_buckets)
    lookup = {v: i for i, v in enumerate(feature.vocabulary)}
    oov = len(feature.vocabulary)
    return np.array([lookup.get(_text(v), oov) for v in values], dtype=np.int64)


def _text(value):
    return value.decode("utf-8", "replace").strip() if isinstance(value, bytes) else str(value).strip()


class Prepared:
    """Model inputs and labels of one split: `x` ({input: array}, or one array for one input), `y`."""

    def __init__(self, x, y, rows):
        self.x, self.y, self.rows = x, y, rows

    def batch(self, rows):
        x = {k: v[rows] for k, v in self.x.items()} if isinstance(self.x, dict) else self.x[rows]
        return x, self.y[rows]


def fit(spec, train):
    """The statistics a spec learns from its train split: numeric means and deviations, the classes,
    and the label's: a regression target's [mean, std] (`target`), each class's or label column's
    share of the rows (`priors`); model_for_data gives them to the model's head. `train_rows` sizes the
    default batch (jobs/spec.py's batch_size_for) where no job has counted the rows."""
    stats = {"numeric": {}, "classes": spec.label.classes, "train_rows": len(train)}
    for f in spec.features:
        if f.type == "numeric" and spec.normalize:
            stats["numeric"][f.name] = _mean_std(train.columns[f.columns[0]])
    task, columns = spec.label.task, spec.label.columns
    if task in ("multiclass", "binary"):
        values, counts = np.unique(train.columns[columns[0]], return_counts=True)
        found = {}
        for value, count in zip(values, counts):
            found[_class_key(value)] = found.get(_class_key(value), 0) + int(count)
        if stats["classes"] is None:
            stats["classes"] = sorted(found, key=_sort_key)
            if task == "binary" and len(stats["classes"]) != 2:
                raise InvalidArgumentError(f"a binary label has two classes; the train split has "
                                           f"{stats['classes'][:10]}")
        stats["priors"] = [found.get(c, 0) / max(1, len(train)) for c in stats["classes"]]
    elif task == "multi_label":
        stats["priors"] = [float(np.mean(train.columns[c].astype(np.float64) == 1)) for c in columns]
    else:
        stats["target"] = _mean_std(train.columns[columns[0]])
    spec.stats = stats
    return stats


def _mean_std(column):
    values = column.astype(np.float64)
    std = float(values.std())
    return [float(values.mean()), std if std > 0 else 1.0]


def _sort_key(value):
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def is_mnist_sample(spec):
    """Whether `spec` is the shipped MNIST sample (`--data mnist`, or no data), whose `mlp` keeps the seeds'
    initialisation (models/spec.py's MNIST_MLP; any other data gets DATA_MLP)."""
    return spec.format == "mnist"


def input_signature(spec):
    """{input: (per-example shape, dtype)} the spec's inputs have (what `build(input_signature)` gets)."""
    signature = {}
    width = sum(f.width for f in spec.features)
    if width:
        signature["input"] = ((width,), "float32")
    for f in spec.features:
        if f.type == "categorical" and f.encode == "ids":
            signature[f.name] = ((1,), "int64")
        elif f.type == "image":
            signature["input" if len(spec.features) == 1 else f.name] = (tuple(f.shape), "float32")
    return signature


def classes(spec):
    """The number of model outputs the label asks for: classes, label columns, or 1 for a regression."""
    if spec.label.task == "regression":
        return 1
    if spec.label.task == "multi_label":
        return len(spec.label.columns)
    return len(spec.stats["classes"])


def prepare(spec, table):
    """Prepared inputs and labels of `table`, with the statistics of `fit`; a label outside the classes
    names its file and line."""
    return Prepared(model_inputs(spec, table), labels(spec, table), len(table))


def model_inputs(spec, table):
    """The model's inputs from a table's feature columns: {input: array}, or one array for one input."""
    if spec.stats is None:
        raise InvalidArgumentError("fit the spec on its train split first (or load its statistics)")
    n, parts, inputs = len(table), [], {}
    for f in spec.features:
        values = table.columns[f.columns[0]] if len(f.columns) == 1 else None
        if f.type == "numeric":
            column = values.astype(np.float32)
            if f.name in spec.stats["numeric"]:
                mean, std = spec.stats["numeric"][f.name]
                column = (column - np.float32(mean)) / np.float32(std)
            parts.append(column.reshape(n, 1))
        elif f.type == "categorical":
            ids = _category_ids(f, values)
            if f.encode == "ids":
                inputs[f.name] = ids.reshape(n, 1)
            else:
                parts.append(np.eye(f.width, dtype=np.float32)[ids])
        else:
            stacked = np.stack([table.columns[c] for c in f.columns], axis=1) if values is None else values
            if stacked[0].size != int(np.prod(f.shape)):
                raise InvalidArgumentError(f"feature {f.name!r}: rows of {stacked[0].size} values do not make the "
                                           f"shape {list(f.shape)}")
            image = stacked.astype(np.float32).reshape((n,) + tuple(f.shape))
            inputs["input" if len(spec.features) == 1 else f.name] = image * np.float32(f.scale or 1.0)
    if parts:
        inputs["input"] = np.concatenate(parts, axis=1)
    return inputs["input"] if list(inputs) == ["input"] else inputs


def labels(spec, table):
    task, columns = spec.label.task, spec.label.columns
    if task == "regression":
        return table.columns[columns[0]].astype(np.float32)
    if task == "multi_label":
        y = np.stack([table.columns[c] for c in columns], axis=1).astype(np.float32)
        bad = np.flatnonzero(~np.isin(y, (0.0, 1.0)).all(axis=1))
        if bad.size:
            raise InvalidArgumentError(f"{table.where(bad[0])}: multi-label columns hold 0 or 1, got "
                                       f"{y[bad[0]].tolist()}")
        return y
    lookup = {c: i for i, c in enumerate(spec.stats["classes"])}
    raw = table.columns[columns[0]]
    ids = np.array([lookup.get(_class_key(v), -1) for v in raw], dtype=np.int32)
    bad = np.flatnonzero(ids < 0)
    if bad.size:
        raise InvalidArgumentError(f"{table.where(bad[0])}: label {_text(raw[bad[0]])!r} in column "
                                   f"{columns[0]!r} is not one of the classes {spec.stats['classes'][:20]}")
    return ids


def inspect(spec):
    """What `zmqflow data inspect` prints: every split's rows (and skipped bad rows), the resolved
    features and the input signature, the label's task and class balance or value range."""
    tables = load_tables(spec)
    stats = fit(spec, tables["train"])
    report = {"name": spec.name, "format": spec.format, "task": spec.label.task,
              "splits": {split: {"rows": len(t), "files": len(t.files), "skipped_bad_rows": t.skipped}
                         for split, t in tables.items()},
              "features_from": "the data" if spec.inferred else "the spec",
              "features": [{"name": f.name, "type": f.type, "columns": len(f.columns),
                            **({"encode": f.encode, "categories": f.width or (len(f.vocabulary) + 1 if f.vocabulary
                                                                              else f.hash_buckets)}
                               if f.type == "categorical" else {}),
                            **({"mean": stats["numeric"][f.name][0], "std": stats["numeric"][f.name][1]}
                               if f.name in stats["numeric"] else {}),
                            **({"shape": list(f.shape)} if f.type == "image" else {}),
                            **_unknown_values(f, tables)} for f in spec.features],
              "input_signature": {k: [list(s), d] for k, (s, d) in input_signature(spec).items()},
              "outputs": classes(spec)}
    label = {}
    for split, table in tables.items():
        y = prepare(spec, table).y
        if spec.label.task in ("multiclass", "binary"):
            counts = np.bincount(y, minlength=len(stats["classes"]))
            label[split] = {str(c): int(n) for c, n in zip(stats["classes"], counts)}
        elif spec.label.task == "multi_label":
            label[split] = {str(c): int(n) for c, n in zip(spec.label.columns, y.sum(axis=0))}
        else:
            label[split] = {"min": float(y.min()), "mean": float(y.mean()), "max": float(y.max())}
    report["label"] = {"columns": spec.label.columns, "classes": stats["classes"], "per_split": label}
    return report


def _unknown_values(feature, tables):
    """{"unknown": {split: {"rows": n, "values": [the most frequent few]}}} of a categorical feature's values
    outside its vocabulary (they all share one slot), or {} when every value is known."""
    if feature.type != "categorical" or feature.vocabulary is None:
        return {}
    unknown = {}
    for split, table in tables.items():
        values = table.columns[feature.columns[0]]
        outside = _category_ids(feature, values) == len(feature.vocabulary)
        if outside.any():
            texts, counts = np.unique([_text(v) for v in values[outside]], return_counts=True)
            unknown[split] = {"rows": int(outside.sum()), "values": texts[np.argsort(-counts, kind="stable")][:5].tolist()}
    return {"unknown": unknown} if unknown else {}


# ------------------------------------------------ the model for the data

TASK_LOSSES = {"multiclass": ("softmax_cross_entropy",), "binary": ("softmax_cross_entropy",),
               "multi_label": ("sigmoid_cross_entropy",), "regression": ("mse", "huber")}
"""The losses (models/layer_model.py's heads) a built-in model may have for each task; the first is the default."""
BUILTIN_TASKS = {"mlp": TASKS, "logistic": ("multiclass", "binary"), "cnn": TASKS, "linear": ("regression",)}


def model_for_data(spec, model):
    """`model` (a model spec) fitted to the data: a built-in gets its input width, outputs and loss
    from the spec, a model of your own its input signature, `outputs` and `task`; every model gets
    its head's statistics of the train split (`head_fields`). InvalidArgument when the model cannot
    take the data or its task (`logistic` classifies, `linear` regresses, mlp and cnn do any task)."""
    signature, task, outputs = input_signature(spec), spec.label.task, classes(spec)
    kind = model.get("type")
    single = list(signature) == ["input"]
    if kind in BUILTIN_TASKS:
        if not single:
            raise InvalidArgumentError(f"the built-in {kind} model takes one input; the data gives {list(signature)} "
                                       "(categorical features with encode: ids need a model of your own with an "
                                       "Embedding, or encode: one_hot)")
        (shape, _), = signature.values()
        if task not in BUILTIN_TASKS[kind]:
            able = [k for k, tasks in BUILTIN_TASKS.items() if task in tasks]
            raise InvalidArgumentError(f"a {task} label needs a model of your own or {', '.join(able)}; "
                                       f"{kind} {'regresses' if kind == 'linear' else 'classifies'}")
        loss = model.get("loss", TASK_LOSSES[task][0] if kind != "linear" else "mse")
        if kind in ("mlp", "cnn", "linear") and loss not in TASK_LOSSES[task]:
            raise InvalidArgumentError(f"model option loss={loss} does not fit a {task} label: give "
                                       f"{' or '.join(TASK_LOSSES[task])}")
    head = head_fields(spec)
    if kind == "mlp":
        if len(shape) != 1:
            raise InvalidArgumentError(f"the built-in MLP takes flat rows; the data's input is {list(shape)}")
        return {**model, "layers": [shape[0], *model["layers"][1:-1], outputs], "loss": loss, **head}
    if kind == "logistic":
        return {**model, "inputs": shape[0] if len(shape) == 1 else int(np.prod(shape)), "classes": outputs, **head}
    if kind == "linear":
        return {**model, "inputs": int(np.prod(shape)), "outputs": 1, **head}
    if kind == "cnn":
        return {**model, "inputs": list(shape) if len(shape) > 1 else shape[0], "loss": loss,
                **({"classes": outputs} if task in ("multiclass", "binary") else {"outputs": outputs}), **head}
    return {**model, "input_signature": {k: [list(s), d] for k, (s, d) in signature.items()}, "outputs": outputs,
            "task": task, **head}


def head_fields(spec):
    """What the train split gives the model's head (models/spec.py's HEAD_FIELDS): a regression's target
    standardised (`target_scale`, with `normalize`; else its mean as the output bias), a classifier's
    output bias at the log class priors (softmax: centred; multi-label: the log-odds), each prior
    kept within [0.001, 0.999] so no output starts at an infinity. {} for statistics without them."""
    stats, task = spec.stats or {}, spec.label.task
    if task == "regression" and stats.get("target"):
        mean, std = stats["target"]
        return {"target_scale": {"mean": [mean], "std": [std]}} if spec.normalize else {"output_bias": [mean]}
    if not stats.get("priors"):
        return {}
    p = np.clip(np.asarray(stats["priors"], dtype=np.float64), 1e-3, 1 - 1e-3)
    bias = np.log(p / (1 - p)) if task == "multi_label" else np.log(p) - np.log(p).mean()
    return {"output_bias": [round(float(b), 6) for b in bias]}


# ------------------------------------------------ with the checkpoint

def to_config(spec):
    """{"spec", "stats"}: what a checkpoint records so the data's inputs can be made again anywhere
    (file paths made absolute; statistics of the train split)."""
    if spec.stats is None:
        raise InvalidArgumentError("fit the spec on its train split before recording it")
    raw = dict(spec.raw)
    if spec.inferred:           # the features as typed from the train split: serving reads no data
        raw = {k: v for k, v in raw.items() if k not in ("drop", "categorical")}
        raw["features"] = {f.name: feature_entry(f) for f in spec.features}
    if spec.format != "mnist":
        raw["files"] = {split: [p if os.path.isabs(p) else os.path.join(spec.base_dir, p) for p in patterns]
                        for split, patterns in spec.files.items()}
    return {"spec": raw, "stats": spec.stats}


def from_config(config):
    """The DataSpec a checkpoint recorded, its statistics loaded (no file is read)."""
    spec = DataSpec(config["spec"])
    spec.stats = config["stats"]
    return spec


def read_features(spec, path):
    """A Table of a file's feature columns (the label may be absent): the rows to predict."""
    check_columns(spec, label=False)
    return read_file(spec, path, label=False)
