"""The sources a data spec reads: files of one format become a `Table` of the columns the spec names.

    source: {format: csv, header: true, delimiter: ","}               # columns by header name (or `columns:`)
    source: {format: npz}                                              # one array per column
    source: {format: npy, columns: [a, b, c]}                          # a structured array, or a 2-D one
    source: {format: tfrecord, compression: GZIP,                      # tf.train.Example, per feature:
             features: {age: {dtype: float32}, pixels: {dtype: float32, shape: [784]}, city: {dtype: string}}}
    source: {format: fixed_length, record_bytes: 785, header_bytes: 4, footer_bytes: 2,
             fields: [[label, uint8, 0], [image, uint8, 1, [784]]]}   # name, dtype, byte offset[, shape]
    source: {format: parquet}                                          # pyarrow: pip install 'zmqflow[parquet]'

TFRecord and fixed-length files are read by the reader service's own streaming formats
(inputs/formats), so a spec and `zmqflow reader` agree on every byte. A column may hold an
array per row (an image feature's one column); a numeric or categorical feature and the label
hold one value per row. Categorical columns become bytes whatever their type, as a CSV gives them,
so ids and hash buckets do not depend on the format. Every bad input is an error naming the file
and where in it: the line and column of a CSV, the record of a TFRecord or fixed-length file
(with its byte offset), the row of an array or Parquet file.
"""

import csv
import dataclasses
import glob
import os
import re

import numpy as np

from zmqflow.common.errors import DataLossError, InvalidArgumentError, NotFoundError, did_you_mean

SOURCES = {
    "csv": {"header": True, "delimiter": ",", "columns": None},
    "npz": {},
    "npy": {"columns": None},
    "tfrecord": {"features": None, "compression": None, "max_record_bytes": None},
    "fixed_length": {"record_bytes": None, "fields": None, "header_bytes": 0, "footer_bytes": 0, "compression": None},
    "parquet": {},
    "mnist": {},
}
"""Each source format and its options with their defaults (None: none, or required where _REQUIRED says)."""
_REQUIRED = {"tfrecord": ("features",), "fixed_length": ("record_bytes", "fields")}
_TFRECORD_FEATURE = ("dtype", "shape", "default")
_CHUNK = 4096


@dataclasses.dataclass
class Table:
    """Rows of one split: {column: array} as read, and where each row came from (for errors)."""

    columns: dict
    files: list
    origins: np.ndarray      # [rows, 2]: index into files, line (CSV, from 1) or record/row (from 0)
    skipped: int = 0
    unit: str = "line"

    def __len__(self):
        return len(self.origins)

    def where(self, row):
        file, place = self.origins[row]
        return f"{self.files[file]}:{place}" if self.unit == "line" else f"{self.files[file]}: {self.unit} {place}"

    def take(self, rows):
        return Table({k: v[rows] for k, v in self.columns.items()}, self.files, self.origins[rows], self.skipped,
                     self.unit)


# ------------------------------------------------ the spec's source: options

def check_source(kind, options):
    """The options of a `source:` of format `kind`, defaults filled; unknown or bad ones are
    InvalidArgumentError, and a TFRecord feature map or a fixed-length layout is checked here."""
    if kind not in SOURCES:
        raise InvalidArgumentError(f"data spec source.format {kind!r} is not one of {', '.join(SOURCES)}"
                                   f"{did_you_mean(kind, SOURCES)}")
    for key in options:
        if key not in SOURCES[kind]:
            raise InvalidArgumentError(f"data spec source: unknown key {key!r} for format {kind}"
                                       f"{did_you_mean(key, SOURCES[kind])}; it takes "
                                       f"{', '.join(SOURCES[kind]) or 'no options'}")
    missing = [name for name in _REQUIRED.get(kind, ()) if options.get(name) is None]
    if missing:
        raise InvalidArgumentError(f"data spec source: format {kind} needs {' and '.join(missing)}")
    source = {**SOURCES[kind], **options}
    if kind == "tfrecord":
        _tfrecord_format(source, list(source["features"]) if isinstance(source["features"], dict) else [])
    elif kind == "fixed_length":
        _fixed_length_format(source, None)
    return source


def _tfrecord_format(source, names, defaults=None):
    """A TFRecordFormat reading `names` from source.features: a FixedLenFeature each (shape [] by default)."""
    from zmqflow.inputs.formats import FixedLenFeature, TFRecordFormat
    features = source["features"]
    if not isinstance(features, dict) or not features:
        raise InvalidArgumentError("data spec source.features maps each feature of the Examples to {dtype, shape}, "
                                   f"e.g. {{age: {{dtype: float32}}, pixels: {{dtype: float32, shape: [784]}}}}; "
                                   f"got {features!r}")
    parsed = {}
    for name in names:
        entry = features[name]
        entry = {"dtype": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or "dtype" not in entry or set(entry) - set(_TFRECORD_FEATURE):
            raise InvalidArgumentError(f"data spec source.features.{name}: {{dtype: float32|int64|string|..., "
                                       f"shape: [...], default: VALUE}}, got {entry!r}")
        default = entry.get("default", (defaults or {}).get(name))
        parsed[name] = FixedLenFeature(entry.get("shape") or [], entry["dtype"], default)
    try:
        return TFRecordFormat(parsed, chunk_size=_CHUNK, compression=source["compression"],
                              **_max_record_bytes(source))
    except (InvalidArgumentError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"data spec source: {exc}") from None


def _max_record_bytes(source):
    """source.max_record_bytes as TFRecordFormat's keyword (absent: its default, 256 MiB)."""
    limit = source.get("max_record_bytes")
    if limit is None:
        return {}
    if type(limit) is not int or limit <= 0:
        raise InvalidArgumentError(f"data spec source.max_record_bytes must be a positive int, got {limit!r}")
    return {"max_record_bytes": limit}


def _fixed_length_format(source, names):
    """A FixedLengthFormat decoding the fields in `names` (all when None) of source.fields."""
    from zmqflow.inputs.formats import FixedLengthFormat
    fields = source["fields"]
    if not isinstance(fields, list) or not fields:
        raise InvalidArgumentError(f"data spec source.fields lists [name, dtype, byte offset, shape] per field, "
                                   f"e.g. [[label, uint8, 0], [image, uint8, 1, [784]]]; got {fields!r}")
    try:
        kept = [f for f in fields if names is None or (f["name"] if isinstance(f, dict) else f[0]) in names]
        return FixedLengthFormat(source["record_bytes"], kept, header_bytes=source["header_bytes"],
                                 footer_bytes=source["footer_bytes"], chunk_size=_CHUNK,
                                 compression=source["compression"])
    except (InvalidArgumentError, TypeError, ValueError, KeyError, IndexError) as exc:
        raise InvalidArgumentError(f"data spec source: {exc}") from None


def source_columns(spec):
    """The columns a record source holds (TFRecord features, fixed-length fields); None for files that
    name their own columns."""
    if spec.format == "tfrecord":
        return list(spec.source["features"])
    if spec.format == "fixed_length":
        return [f["name"] if isinstance(f, dict) else f[0] for f in spec.source["fields"]]
    return None


def check_columns(spec, label=True):
    """Every column the spec reads is one the source declares (a TFRecord feature, a fixed-length field)."""
    declared = source_columns(spec)
    if declared is None:
        return
    missing = [c for c in needed(spec, label) if c not in declared]
    if missing:
        what = "features" if spec.format == "tfrecord" else "fields"
        raise InvalidArgumentError(f"data spec: column(s) {missing} are not in source.{what} "
                                   f"(it has {', '.join(map(str, declared))})")


# ------------------------------------------------ files

def paths(spec, patterns, split):
    """The files of a split's globs (relative to the spec's folder), each glob matching at least one."""
    found_all = []
    for pattern in patterns:
        full = pattern if os.path.isabs(pattern) else os.path.join(spec.base_dir, pattern)
        found = sorted(glob.glob(full))
        if not found:
            raise NotFoundError(f"data spec files.{split}: {pattern!r} matches no file (looked for {full})")
        found_all += found
    return found_all


def needed(spec, label=True):
    """{column: 'float32' | 'string'} of every column a feature (and, with `label`, the label) reads."""
    kinds = {}
    for f in spec.features:
        for c in f.columns:
            kinds[c] = "string" if f.type == "categorical" else "float32"
    for c in spec.label.columns if label else ():
        kinds[c] = "float32" if spec.label.task in ("regression", "multi_label") else "string"
    return kinds


def read_file(spec, path, label=True):
    """A Table of one file of the spec's format: the columns its features (and, with `label`, its label) read."""
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise InvalidArgumentError(f"{path} is empty")
    if spec.format == "mnist":      # rows to predict for the built-in spec: p0..p783 in an .npz or a CSV's header
        return (read_npz if str(path).endswith(".npz") else read_csv)(spec, path, label)
    return READERS[spec.format](spec, path, label)


def concat(tables):
    """One Table of several files' Tables (of one format)."""
    files = [f for t in tables for f in t.files]
    offsets = np.cumsum([0] + [len(t.files) for t in tables[:-1]])
    origins = np.concatenate([t.origins + [o, 0] for t, o in zip(tables, offsets)])
    columns = {k: np.concatenate([t.columns[k] for t in tables]) for k in tables[0].columns}
    return Table(columns, files, origins, sum(t.skipped for t in tables), tables[0].unit)


def _table(spec, path, columns, unit, label):
    """A Table of one file's columns, each row counted from 0 in `unit`s: a feature or label that is one
    value holds one per row, an image's one column the image's values; categorical columns become bytes."""
    rows = {len(v) for v in columns.values()}
    if len(rows) != 1:
        raise InvalidArgumentError(f"{path}: the columns have different numbers of {unit}s {sorted(rows)}")
    count = rows.pop()
    if count == 0:
        raise InvalidArgumentError(f"{path} has no {unit}s")
    images = {f.columns[0]: f for f in spec.features if f.type == "image" and len(f.columns) == 1}
    kinds = needed(spec, label)
    for column in kinds:
        values = columns[column]
        size = int(np.prod(values.shape[1:], dtype=np.int64))
        if column in images:
            shape = images[column].shape
            if size != int(np.prod(shape)):
                raise InvalidArgumentError(f"{path}: column {column!r} holds {size} values per {unit}; image feature "
                                           f"{images[column].name!r} has shape {list(shape)}")
        elif size != 1:
            raise InvalidArgumentError(f"{path}: column {column!r} holds {size} values per {unit}; a feature or "
                                       "label reads one (an image feature reads an array)")
        else:
            columns[column] = values.reshape(count)
    categorical = {c for f in spec.features if f.type == "categorical" for c in f.columns}
    for column in categorical & set(kinds):
        columns[column] = _as_bytes(columns[column])
    origins = np.stack([np.zeros(count, np.int64), np.arange(count, dtype=np.int64)], axis=1)
    return Table({c: columns[c] for c in kinds}, [path], origins, unit=unit)


def _as_bytes(values):
    """Text of each value as bytes, as a CSV field would be: 3 (or 3.0) -> b'3', 'rome' -> b'rome'."""
    if values.dtype.kind == "O" and all(isinstance(v, bytes) for v in values):
        return values
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values.tolist()):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        out[i] = v if isinstance(v, bytes) else str(v).encode()
    return out


def _few(names):
    """A list for an error message: its first ten names, then how many more."""
    return f"{names[:10]}{f' and {len(names) - 10} more' if len(names) > 10 else ''}"


def _missing(path, columns, available, what="column"):
    missing = [c for c in columns if c not in available]
    if missing:
        names = list(available)
        raise InvalidArgumentError(f"{path}: {what}(s) {_few(missing)} named in the data spec are not in the file "
                                   f"(it holds {', '.join(map(str, names[:20]))}{' ...' if len(names) > 20 else ''})")


# ------------------------------------------------ the readers

def csv_column_names(spec, path):
    """The columns of a CSV file: its header, or the spec's source.columns, or numbers from 0."""
    from zmqflow.inputs.formats.base import open_input, resolve_compression
    with open_input(path, resolve_compression(path, None)) as f:      # a .csv.gz is read decompressed
        first = f.readline()
    if not first.strip():
        raise InvalidArgumentError(f"{path} is empty")
    if spec.header:   # "x1, x2, target" names x2 and target, not " x2" (the chapter's my_test.csv)
        return [name.strip() for name in next(csv.reader([first.decode("utf-8", "replace").strip("\r\n")],
                                                          delimiter=spec.delimiter))]
    if spec.column_names:
        return list(spec.column_names)
    return list(range(first.decode("latin-1").count(spec.delimiter) + 1))


def column_names(spec, path):
    """Every column of a file of the spec's format, in the file's order: what a spec without
    `features` chooses from."""
    declared = source_columns(spec)
    if declared is not None:
        return declared
    if spec.format == "csv":
        return csv_column_names(spec, path)
    if spec.format == "npz":
        return list(_load_numpy(path, ".npz").files)
    if spec.format == "npy":
        array = _load_numpy(path, ".npy")
        if array.dtype.names:
            return list(array.dtype.names)
        return list(spec.source["columns"] or range(array.shape[1] if array.ndim == 2 else 0))
    if spec.format == "parquet":
        try:
            import pyarrow.parquet as pq
            return list(pq.ParquetFile(path).schema_arrow.names)
        except ImportError:
            raise InvalidArgumentError(f"{path}: reading Parquet needs pyarrow: pip install 'zmqflow[parquet]'") from None
        except Exception as exc:        # pyarrow's errors: ArrowException, OSError
            raise InvalidArgumentError(f"{path} is not a readable Parquet file: {exc}") from None
    raise InvalidArgumentError(f"a {spec.format} data spec lists its features")


def csv_format(spec, path, label=True, chunk_size=None):
    """(column names, CsvFormat) of one CSV file as the spec reads it: the header (or the spec's
    columns) names the columns, the needed ones are parsed (numbers as float32, categories and class
    labels as text), an empty field takes its feature's default. Shared by read_csv and the readers'
    stream (spec_stream.py), so both parse a file alike."""
    from zmqflow.inputs.formats.csv_format import CsvFormat
    names = csv_column_names(spec, path)
    index = {name: i for i, name in enumerate(names)}
    kinds = needed(spec, label)
    missing = [c for c in kinds if c not in index]
    if missing:
        raise InvalidArgumentError(f"{path}: column(s) {_few(missing)} named in the data spec are not in the file "
                                   f"(its columns: {', '.join(map(str, names[:20]))}{' ...' if len(names) > 20 else ''})")
    # a default of a numeric feature is a float whatever it was written as: `default: 0` must not make the
    # column int32 and refuse 3.25
    defaults = {f.columns[0]: (float(f.default) if f.type == "numeric" else f.default)
                for f in spec.features if f.default is not None}
    record_defaults = ["string"] * len(names)
    for column, kind in kinds.items():
        record_defaults[index[column]] = [defaults[column]] if column in defaults else kind
    fmt = CsvFormat(record_defaults, columns={str(c): index[c] for c in kinds}, field_delim=spec.delimiter,
                    skip_header_lines=1 if spec.header else 0, skip_bad_rows=spec.skip_bad_rows,
                    chunk_size=chunk_size or _CHUNK)
    return names, fmt


def read_csv(spec, path, label=True):
    """A Table of one CSV file's needed columns (without the label's unless `label`); errors name the
    file, line and column."""
    names, fmt = csv_format(spec, path, label)
    kinds = needed(spec, label)
    parts, lines = [], []
    try:
        for chunk in fmt.read(path):
            parts.append(chunk.features)
            lines.append(chunk.start + np.arange(chunk.count))
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(name_columns(str(exc), names)) from None
    if not parts:
        raise InvalidArgumentError(f"{path} has no rows{' after its header' if spec.header else ''}")
    columns = {c: np.concatenate([p[str(c)] for p in parts]) for c in kinds}
    # line numbers of kept rows: CsvFormat counts instances, so bad rows skipped shift them; count from 1
    line = np.concatenate(lines) + 1 + (1 if spec.header else 0)
    return Table(columns, [path], np.stack([np.zeros(len(line), np.int64), line], axis=1),
                 fmt.counters.malformed_skipped)


def name_columns(message, names):
    """CsvFormat's 'column 3: ...' (its index, from 0) -> 'column 4 (age): ...': the column as the user
    counts it in the file, from 1 as its lines are, and by name."""
    return re.sub(r"column (\d+)", lambda m: f"column {int(m.group(1)) + 1} ({names[int(m.group(1))]})"
                  if int(m.group(1)) < len(names) else m.group(0), message)


def _load_numpy(path, kind):
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InvalidArgumentError(f"{path} is not a readable {kind} file: {exc}") from None


def read_npz(spec, path, label=True):
    """A Table of an .npz file: one array per column, rows along the first axis."""
    arrays = _load_numpy(path, ".npz")
    if not hasattr(arrays, "files"):
        raise InvalidArgumentError(f"{path} holds one array, not an .npz archive of one per column; use format npy")
    kinds = needed(spec, label)
    _missing(path, kinds, sorted(arrays.files), "array")
    return _table(spec, path, {c: arrays[c] for c in kinds}, "row", label)


def read_npy(spec, path, label=True):
    """A Table of an .npy file: a structured array (a column per field), or a 2-D array whose columns are
    named by source.columns, or numbered from 0 without it."""
    array = _load_numpy(path, ".npy")
    if hasattr(array, "files"):
        raise InvalidArgumentError(f"{path} is an .npz archive; use format npz")
    kinds = needed(spec, label)
    if array.dtype.names:
        _missing(path, kinds, array.dtype.names, "field")
        return _table(spec, path, {c: array[c] for c in kinds}, "row", label)
    if array.ndim != 2:
        raise InvalidArgumentError(f"{path}: an .npy source is a structured array or a 2-D array [rows, columns], "
                                   f"got shape {list(array.shape)}")
    names = list(spec.source["columns"] or range(array.shape[1]))
    if len(names) != array.shape[1]:
        raise InvalidArgumentError(f"{path} has {array.shape[1]} columns; source.columns names {len(names)}")
    _missing(path, kinds, names)
    return _table(spec, path, {c: array[:, names.index(c)] for c in kinds}, "row", label)


_AT_OFFSET = re.compile(r"record at offset (\d+)")


def _read_records(spec, path, fmt, label, index_of):
    """The columns of every record of a streaming format; an error's 'record at offset N' gets the
    record's index from `index_of(N)`."""
    parts = []
    try:
        for chunk in fmt.read(path):
            parts.append(chunk.features)
    except (InvalidArgumentError, DataLossError) as exc:
        text = _AT_OFFSET.sub(lambda m: f"record {index_of(int(m.group(1)))} (offset {m.group(1)})", str(exc))
        raise type(exc)(text) from None
    if not parts:
        raise InvalidArgumentError(f"{path} has no records")
    return _table(spec, path, {c: np.concatenate([p[c] for p in parts]) for c in needed(spec, label)}, "record",
                  label)


def read_tfrecord(spec, path, label=True):
    """A Table of a TFRecord file of tf.train.Example (GZIP or not); a feature absent from an Example
    takes the spec's default or is an error naming the record."""
    from zmqflow.inputs.formats.base import open_input, resolve_compression
    from zmqflow.inputs.formats.tfrecord import framed_records
    defaults = {f.columns[0]: f.default for f in spec.features if f.default is not None}
    fmt = _tfrecord_format(spec.source, list(needed(spec, label)), defaults)

    def index_of(offset):
        count = 0
        try:
            with open_input(path, resolve_compression(path, spec.source["compression"])) as stream:
                for at, _ in framed_records(stream, path, fmt.max_record_bytes):
                    if at >= offset:
                        break
                    count += 1
        except DataLossError:
            pass
        return count
    return _read_records(spec, path, fmt, label, index_of)


def read_fixed_length(spec, path, label=True):
    """A Table of a file of fixed-length records, each decoded by source.fields."""
    fmt = _fixed_length_format(spec.source, set(needed(spec, label)))
    header, size = spec.source["header_bytes"], spec.source["record_bytes"]
    return _read_records(spec, path, fmt, label, lambda offset: (offset - header) // size)


def read_parquet(spec, path, label=True):
    """A Table of a Parquet file's columns (pyarrow, the `parquet` extra); an empty value takes the
    feature's default or is an error naming the row and column."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise InvalidArgumentError(f"{path}: reading Parquet needs pyarrow: pip install 'zmqflow[parquet]'") from None
    kinds = needed(spec, label)
    try:
        parquet = pq.ParquetFile(path)
        _missing(path, kinds, parquet.schema_arrow.names)
        table = parquet.read(columns=list(kinds))
    except (pa.ArrowException, OSError) as exc:
        raise InvalidArgumentError(f"{path} is not a readable Parquet file: {exc}") from None
    defaults = {f.columns[0]: f.default for f in spec.features if f.default is not None}
    columns = {}
    for name in kinds:
        column = table.column(name)
        if column.null_count:
            if name not in defaults:
                row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
                raise InvalidArgumentError(f"{path}: row {row}: column {name!r} is empty (give its feature a default)")
            column = column.fill_null(pa.scalar(defaults[name]).cast(column.type))
        columns[name] = _numpy_column(path, name, column, pa)
    return _table(spec, path, columns, "row", label)


def _numpy_column(path, name, column, pa):
    """A Parquet column as an array; a list column (an image's values) as [rows, values], every row alike."""
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
            or pa.types.is_fixed_size_list(column.type)):
        values = column.to_numpy(zero_copy_only=False)
        return values if values.dtype.kind != "U" else values.astype(object)
    rows = column.to_pylist()
    sizes = np.array([len(r or ()) for r in rows])
    bad = np.flatnonzero(sizes != sizes[0]) if len(rows) else []
    if len(bad):
        raise InvalidArgumentError(f"{path}: row {bad[0]}: column {name!r} holds {sizes[bad[0]]} values; "
                                   f"row 0 holds {sizes[0]}")
    return np.array(rows, dtype=np.float32 if pa.types.is_floating(column.type.value_type) else None)


def read_mnist(splits):
    """{split: Table} of the shipped MNIST sample's splits (train, test): p0..p783 in [0, 1] and label. The
    CSV is read once for all of them."""
    from zmqflow.inputs.datasets import MNIST_CSV, mnist_split
    train, test = mnist_split()
    tables = {}
    for split in splits:
        x, y = train if split == "train" else test
        columns = {f"p{i}": x[:, i] for i in range(x.shape[1])}
        columns["label"] = y.astype(np.float32)
        tables[split] = Table(columns, [MNIST_CSV],
                              np.stack([np.zeros(len(y), np.int64), np.arange(len(y)) + 1], axis=1))
    return tables


READERS = {"csv": read_csv, "npz": read_npz, "npy": read_npy, "tfrecord": read_tfrecord,
           "fixed_length": read_fixed_length, "parquet": read_parquet}
