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

import dataclasses
import os
import re
from collections.abc import Mapping

import numpy as np
import yaml

from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.inputs.data_sources import (SOURCES, Table, check_columns, check_source, concat, paths, read_csv,  # noqa: F401
                                         read_file, read_mnist, read_npz)   # Table and the readers: re-exported

TASKS = ("multiclass", "binary", "multi_label", "regression")
FEATURE_TYPES = ("numeric", "categorical", "image")
SPLITS = ("train", "validation", "test")
FORMATS = tuple(SOURCES)
MNIST = {"name": "mnist", "source": {"format": "mnist"}, "files": {"train": "shipped", "test": "shipped"},
         "features": {"image": {"type": "image", "columns": "p0..p783", "shape": [784]}},
         "label": {"column": "label", "task": "multiclass", "classes": list(range(10))}, "normalize": False}
"""The shipped MNIST sample (inputs/datasets.py): 4,500 train and 500 test rows, pixels in [0, 1]."""
BUILTIN = {"mnist": MNIST}
_RANGE = re.compile(r"^([A-Za-z_][\w]*?)(\d+)\.\.([A-Za-z_][\w]*?)?(\d+)$")


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
    """A checked data spec; `load(split)` reads a split, `inputs(raw)` makes the model's inputs."""

    def __init__(self, raw, base_dir="."):
        if not isinstance(raw, Mapping):
            raise InvalidArgumentError(f"a data spec is a mapping (source, files, features, label), got "
                                       f"{type(raw).__name__}")
        unknown = sorted(set(raw) - {"source", "files", "split", "features", "label", "normalize", "skip_bad_rows",
                                     "name"})
        if unknown:
            raise InvalidArgumentError(f"data spec: unknown field(s) {unknown}; known: source, files, split, features, "
                                       "label, normalize, skip_bad_rows, name")
        self.raw, self.base_dir = dict(raw), base_dir
        self.name = raw.get("name", "data")
        source = dict(raw.get("source") or {"format": "csv"})
        self.format = source.pop("format", "csv")
        self.source = check_source(self.format, source)     # the format's options (data_sources.SOURCES)
        self.header = bool(self.source.get("header", True))
        self.delimiter = self.source.get("delimiter", ",")
        self.column_names = self.source.get("columns")
        self.files = self._files(raw.get("files"))
        self.split = self._split(raw.get("split"))
        self.features = [self._feature(name, value) for name, value in (raw.get("features") or {}).items()]
        if not self.features:
            raise InvalidArgumentError("data spec: `features` names no feature; list the columns the model reads")
        self.label = self._label(raw.get("label"))
        self.normalize = bool(raw.get("normalize", True))
        self.skip_bad_rows = bool(raw.get("skip_bad_rows", False))
        self.stats = None
        self.tables = None      # (the files' signature, the splits as read): load_tables reads once

    # ------------------------------------------------ reading the spec

    def _files(self, files):
        if isinstance(files, (str, list)):
            files = {"train": files}
        if not isinstance(files, Mapping) or "train" not in files:
            raise InvalidArgumentError("data spec `files` needs a train entry: a glob, a list, or {train: ..., "
                                       "validation: ..., test: ...}")
        unknown = sorted(set(files) - set(SPLITS))
        if unknown:
            raise InvalidArgumentError(f"data spec files: unknown split(s) {unknown}; splits are {', '.join(SPLITS)}")
        return {split: [files[split]] if isinstance(files[split], str) else list(files[split]) for split in files}

    def _split(self, split):
        if split is None:
            return {}
        if not isinstance(split, Mapping) or set(split) - {"validation", "test", "seed"}:
            raise InvalidArgumentError(f"data spec split is {{validation: FRACTION, test: FRACTION, seed: N}}, "
                                       f"got {split!r}")
        for part in ("validation", "test"):
            if part in split and part in self.files:
                raise InvalidArgumentError(f"data spec: the {part} split has files and a fraction; give one")
            fraction = split.get(part, 0)
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
                raise InvalidArgumentError(f"data spec split.{part} must be a fraction in [0, 1), got {fraction!r}")
        if split.get("validation", 0) + split.get("test", 0) >= 1:
            raise InvalidArgumentError("data spec split: validation and test together leave no training rows")
        return dict(split)

    def _feature(self, name, value):
        value = {"type": value} if isinstance(value, str) else dict(value or {})
        kind = value.pop("type", "numeric")
        if kind not in FEATURE_TYPES:
            raise InvalidArgumentError(f"feature {name!r}: type {kind!r} is not one of {', '.join(FEATURE_TYPES)}")
        columns = _columns(value.pop("columns", value.pop("column", name)))
        feature = Feature(name, kind, columns, default=value.pop("default", None),
                          vocabulary=value.pop("vocabulary", None), hash_buckets=value.pop("hash_buckets", None),
                          encode=value.pop("encode", "one_hot"), shape=value.pop("shape", None),
                          scale=value.pop("scale", None))
        if value:
            raise InvalidArgumentError(f"feature {name!r}: unknown field(s) {sorted(value)}")
        if kind == "categorical":
            if (feature.vocabulary is None) == (feature.hash_buckets is None):
                raise InvalidArgumentError(f"feature {name!r}: a categorical feature needs a vocabulary or "
                                           "hash_buckets (one of them)")
            if feature.encode not in ("one_hot", "ids"):
                raise InvalidArgumentError(f"feature {name!r}: encode is one_hot or ids, got {feature.encode!r}")
            if feature.vocabulary is not None:
                feature.vocabulary = [str(v) for v in feature.vocabulary]
        if kind == "image":
            shape = tuple(int(n) for n in (feature.shape or (len(columns),)))
            if len(columns) > 1 and int(np.prod(shape)) != len(columns):   # one column: an array of that shape
                raise InvalidArgumentError(f"feature {name!r}: shape {list(shape)} holds {int(np.prod(shape))} values, "
                                           f"the feature has {len(columns)} columns")
            feature.shape = shape
        elif len(columns) != 1:
            raise InvalidArgumentError(f"feature {name!r}: a {kind} feature is one column, got {len(columns)}")
        return feature

    def _label(self, label):
        if isinstance(label, str):
            label = {"column": label}
        if not isinstance(label, Mapping):
            raise InvalidArgumentError("data spec `label` names the label column: {column: NAME, task: multiclass}")
        label = dict(label)
        columns = _columns(label.pop("columns", label.pop("column", None)))
        task = label.pop("task", "multiclass")
        classes = label.pop("classes", None)
        if label:
            raise InvalidArgumentError(f"data spec label: unknown field(s) {sorted(label)}")
        if task not in TASKS:
            raise InvalidArgumentError(f"label task {task!r} is not one of {', '.join(TASKS)}")
        if task != "multi_label" and len(columns) != 1:
            raise InvalidArgumentError(f"a {task} label is one column, got {columns}")
        if task == "binary" and classes is not None and len(classes) != 2:
            raise InvalidArgumentError(f"a binary label has two classes, got {classes}")
        overlap = sorted(set(columns) & {c for f in self.features for c in f.columns})
        if overlap:
            raise InvalidArgumentError(f"column(s) {overlap} are both a feature and the label")
        return Label(columns, task, None if classes is None else [_class_key(c) for c in classes])


def _columns(value):
    """A list of column names (or indices) from a name, a list, or a range text "p0..p783"."""
    if value is None:
        raise InvalidArgumentError("data spec: a feature or label needs its column")
    if isinstance(value, str):
        match = _RANGE.match(value.strip())
        if match:
            prefix, first, other, last = match.groups()
            if other not in (None, prefix) or int(last) < int(first):
                raise InvalidArgumentError(f"column range {value!r} is PREFIX<first>..<last>, e.g. p0..p783")
            return [f"{prefix}{i}" for i in range(int(first), int(last) + 1)]
        return [value]
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (list, tuple)) and value:
        return list(value)
    raise InvalidArgumentError(f"columns must be a name, a list or a range like p0..p783, got {value!r}")


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
    if not os.path.isfile(path):
        raise NotFoundError(f"data spec {path!r} does not exist")
    with open(path, encoding="utf-8") as f:
        try:
            raw = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise InvalidArgumentError(f"data spec {path!r} is not valid YAML: {exc}") from None
    return DataSpec(raw, base_dir=os.path.dirname(os.path.abspath(path)))


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
        tables = {split: read_mnist(split) for split in spec.files}
    else:
        check_columns(spec)
        tables = {split: concat([read_file(spec, p) for p in paths(spec, patterns, split)])
                  for split, patterns in spec.files.items()}
    if spec.split:
        train = tables["train"]
        order = np.random.default_rng(spec.split.get("seed", 0)).permutation(len(train))
        start = 0
        for part in ("validation", "test"):
            count = int(round(len(train) * spec.split.get(part, 0)))
            if spec.split.get(part, 0) and count == 0:
                raise InvalidArgumentError(f"data spec split.{part} = {spec.split[part]} of {len(train)} rows leaves "
                                           f"no {part} rows")
            if count:
                tables[part] = train.take(np.sort(order[start:start + count]))
                start += count
        tables["train"] = train.take(np.sort(order[start:]))
    return tables


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
    share of the rows (`priors`); model_for_data gives them to the model's head."""
    stats = {"numeric": {}, "classes": spec.label.classes}
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
              "features": [{"name": f.name, "type": f.type, "columns": len(f.columns),
                            **({"encode": f.encode, "categories": f.width or (len(f.vocabulary) + 1 if f.vocabulary
                                                                              else f.hash_buckets)}
                               if f.type == "categorical" else {}),
                            **({"mean": stats["numeric"][f.name][0], "std": stats["numeric"][f.name][1]}
                               if f.name in stats["numeric"] else {}),
                            **({"shape": list(f.shape)} if f.type == "image" else {})} for f in spec.features],
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
