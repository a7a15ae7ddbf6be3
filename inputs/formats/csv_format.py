"""CSV like TensorFlow's TextLineReader + decode_csv, streamed a chunk of lines at a time.

`record_defaults` has one entry per column, giving its type and the value of an
empty field, with TensorFlow's conventions:

    [-1.0] or -1.0      float32, -1.0 when empty        [0] or 0        int32 (int64 past int32's range)
    [np.float64(0)]     a numpy scalar keeps its dtype  [""] or [b""]   string (bytes)
    "float32", "int64", "string", np.int32, float, ...  required: an empty field makes the line malformed

A field is empty when nothing but spaces is left of it ("1. , , 0": the middle one), as
TensorFlow reads the chapter's my_test.csv (examples/data/my_test.csv); numbers may have
spaces around them, strings are kept as written.

`columns` maps feature names to one column index (a scalar feature) or a list /
range of columns of one type (a vector feature): {"image": range(784), "label": 784}.
By default every column is its own feature, "col0", "col1", ... Columns not selected
are counted but not parsed. Fields may be quoted ("a,b", "" for a quote), as with
TF's use_quote_delim. Line numbers in errors count from 1 and include header lines.

Parsing: a chunk of numeric features goes through numpy.loadtxt's C parser in one
pass (a structured dtype, one field per feature). A chunk it refuses (empty fields,
quotes, malformed lines) or one with string features takes the split path, which
applies defaults and finds the bad lines, so both paths give the same result.
"""

import csv
from itertools import islice
from operator import itemgetter

import numpy as np

from zmqflow.common.errors import InvalidArgumentError, check_int
from zmqflow.common.renames import renamed_keywords
from zmqflow.inputs.formats.base import RecordFormat

_TYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64, "string": object}
_PYTHON_TYPES = {float: "float32", int: "int32", str: "string", bytes: "string"}
_PARSE_ERRORS = (ValueError, OverflowError)


def _type_name(dtype):
    """'float32' for 'float32', np.float32, np.dtype('float32') or float; InvalidArgument otherwise."""
    if isinstance(dtype, type) and dtype in _PYTHON_TYPES:
        return _PYTHON_TYPES[dtype]
    try:
        name = "string" if isinstance(dtype, str) and dtype == "string" else np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in _TYPES:
        raise InvalidArgumentError(f"record default {dtype!r}: unsupported type; use one of {', '.join(_TYPES)}")
    return name


def column_type(entry):
    """(type name, default or None when required) of one record_defaults entry."""
    if isinstance(entry, (list, tuple)):
        if len(entry) != 1:
            raise InvalidArgumentError(f"record default {entry!r}: give [value], or a dtype name for a required column")
        entry = entry[0]
    elif isinstance(entry, str) or isinstance(entry, (type, np.dtype)):
        return _type_name(entry), None
    if isinstance(entry, (str, bytes)):
        return "string", entry.encode() if isinstance(entry, str) else entry
    if isinstance(entry, np.generic):
        return _type_name(entry.dtype), entry
    if isinstance(entry, bool) or not isinstance(entry, (int, float)):
        raise InvalidArgumentError(f"record default {entry!r}: expected a number, a string or a dtype name")
    if isinstance(entry, int) and not -2 ** 31 <= entry < 2 ** 31:
        return "int64", entry
    return _PYTHON_TYPES[type(entry)], entry


class _Feature:
    """One output feature: its columns, their common type, per-column defaults and required flags."""

    def __init__(self, name, cols, types, ncols):
        scalar = isinstance(cols, (int, np.integer)) and not isinstance(cols, bool)
        cols = (int(cols),) if scalar else tuple(int(c) for c in cols)
        if not cols or any(not 0 <= c < ncols for c in cols):
            raise InvalidArgumentError(f"feature {name!r}: columns must be non-empty and within 0..{ncols - 1}")
        kinds = {types[c][0] for c in cols}
        if len(kinds) != 1:
            raise InvalidArgumentError(f"feature {name!r}: its columns have different types {sorted(kinds)}")
        self.name, self.cols, self.scalar, self.dtype = name, cols, scalar, kinds.pop()
        self.shape = () if scalar else (len(cols),)
        np_type = _TYPES[self.dtype]
        defaults = [types[c][1] if types[c][1] is not None else (b"" if np_type is object else 0) for c in cols]
        self.defaults = np.array(defaults, dtype=np_type).reshape(self.shape)
        self.required = np.array([types[c][1] is None for c in cols]).reshape(self.shape)
        if scalar:
            self.take = itemgetter(cols[0])
        elif cols == tuple(range(cols[0], cols[0] + len(cols))):  # a slice is the fastest way to take them
            self.take = itemgetter(slice(cols[0], cols[-1] + 1))
        else:  # not contiguous, so at least two columns: itemgetter gives a tuple
            self.take = itemgetter(*cols)


class CsvFormat(RecordFormat):
    """Delimited text lines -> features, with TF's record_defaults; see the module docstring."""

    kind = "csv"

    @renamed_keywords(skip_malformed="skip_bad_rows")   # the data spec's name for it
    def __init__(self, record_defaults, columns=None, field_delim=",", skip_header_lines=0,
                 skip_bad_rows=False, chunk_size=256, compression=None, scale=None):
        if not isinstance(field_delim, str) or len(field_delim.encode()) != 1 or field_delim in '"\r\n':
            raise InvalidArgumentError(f"field_delim must be one ASCII character, not a quote: {field_delim!r}")
        check_int("skip_header_lines", skip_header_lines)
        types = [column_type(entry) for entry in record_defaults]
        if not types:
            raise InvalidArgumentError("record_defaults must have one entry per column")
        if columns is None:
            columns = {f"col{i}": i for i in range(len(types))}
        self.field_delim, self._delim = field_delim, field_delim.encode()
        self.skip_header_lines, self.skip_bad_rows = skip_header_lines, bool(skip_bad_rows)
        self._ncols = len(types)
        self._features = [_Feature(name, cols, types, self._ncols) for name, cols in dict(columns).items()]
        self._struct = None
        if all(f.dtype != "string" for f in self._features):
            self._struct = np.dtype([(f.name, _TYPES[f.dtype], f.shape) for f in self._features])
            self._usecols = [c for f in self._features for c in f.cols]
            if self._usecols == list(range(self._ncols)):
                # every column, in order: loadtxt itself refuses a wrong field count, an empty field or a
                # quote, so the per-line pre-check (13% of the parse time) is not needed
                self._usecols = None
        super().__init__(chunk_size, compression, scale)

    def _spec(self):
        return {f.name: (f.dtype, f.shape) for f in self._features}

    def _chunks(self, stream, path):
        lineno = 1
        for _ in range(self.skip_header_lines):
            line = stream.readline()
            if not line:
                return
            self.counters.bytes_read += len(line)
            lineno += 1
        while lines := list(islice(stream, self.chunk_size)):
            self.counters.bytes_read += sum(map(len, lines))
            features, count = self._parse(lines, path, lineno)
            lineno += len(lines)
            if count:
                yield features, count

    def _parse(self, lines, path, lineno):
        """Features of the good lines of a chunk; a bad line raises, or is skipped and counted."""
        if self._struct is not None and (self._usecols is None or self._plain(lines)):
            try:
                table = np.loadtxt(lines, dtype=self._struct, delimiter=self.field_delim,
                                   usecols=self._usecols, comments=None, ndmin=1)
            except _PARSE_ERRORS:
                table = None
            if table is not None and len(table) == len(lines):
                return {f.name: np.ascontiguousarray(table[f.name]) for f in self._features}, len(lines)
        features, keep, bad = self._parse_split(lines)
        if bad and not self.skip_bad_rows:
            first = min(bad)
            raise InvalidArgumentError(f"{path}:{lineno + first}: malformed CSV line: {bad[first]}")
        self.counters.malformed_skipped += len(bad)
        return {name: values[keep] for name, values in features.items()}, int(keep.sum())

    def _plain(self, lines):
        """Every line has the right number of delimiters and no quote: loadtxt may parse the chunk."""
        want = self._ncols - 1
        return all(line.count(self._delim) == want and b'"' not in line for line in lines)

    def _split(self, line):
        line = line[:-1] if line.endswith(b"\n") else line
        line = line[:-1] if line.endswith(b"\r") else line
        if b'"' not in line:
            return line.split(self._delim)
        row = next(csv.reader([line.decode("latin-1")], delimiter=self.field_delim))
        return [field.encode("latin-1") for field in row]

    def _parse_split(self, lines):
        """(features of the well-formed rows, mask of rows to keep, {line index: reason} of bad lines)."""
        rows, index, bad = [], [], {}
        for i, line in enumerate(lines):
            fields = self._split(line)
            if len(fields) == self._ncols:
                rows.append(fields)
                index.append(i)
            else:
                bad[i] = f"expected {self._ncols} fields, got {len(fields)}"
        keep = np.ones(len(rows), dtype=bool)

        def reject(j, reason):
            keep[j] = False
            bad.setdefault(index[j], reason)

        features = {f.name: self._column_values(f, rows, reject) for f in self._features}
        return features, keep, bad

    def _column_values(self, f, rows, reject):
        """A feature's values over `rows`: empty fields take their default; bad rows are rejected."""
        np_type = _TYPES[f.dtype]
        if not rows:
            return np.empty((0,) + f.shape, dtype=np_type)
        raw = np.array([f.take(row) for row in rows], dtype=object if np_type is object else bytes)
        raw = raw.reshape((len(rows),) + f.shape)
        empty = _blank(raw)
        missing = (empty & f.required).reshape(len(rows), -1)
        for j in np.flatnonzero(missing.any(axis=1)):
            reject(j, f"column {f.cols[int(np.argmax(missing[j]))]} is empty and has no default")
        if np_type is object:
            return np.where(empty, f.defaults, raw)
        text = np.where(empty, b"0", raw)
        try:
            values = text.astype(np_type)
        except _PARSE_ERRORS:
            values = np.zeros(text.shape, dtype=np_type)
            for j in range(len(text)):
                try:
                    values[j] = text[j].astype(np_type)
                except _PARSE_ERRORS:
                    reject(j, self._unparsable(f, text[j]))
        return np.where(empty, f.defaults, values)

    @staticmethod
    def _unparsable(f, fields):
        for col, field in zip(f.cols, np.atleast_1d(fields)):
            try:
                np.array([field]).astype(_TYPES[f.dtype])
            except _PARSE_ERRORS:
                return f"column {col}: cannot parse {bytes(field).decode('latin-1')!r} as {f.dtype}"
        return f"feature {f.name!r}: cannot parse as {f.dtype}"


def _blank(raw):
    """True where a field is empty once spaces are stripped (TF gives such a field its record default)."""
    if raw.dtype != object:
        return np.char.strip(raw, b" \t") == b""
    return np.frompyfunc(lambda field: not field.strip(b" \t"), 1, 1)(raw).astype(bool)
