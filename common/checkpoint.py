"""Checkpoints of the ps shards: per variable piece, atomic, restorable onto any placement.

Layout of a checkpoint directory:

    latest                        "ckpt-<step>": the newest committed checkpoint (replaced atomically)
    ckpt-<step>/manifest.json     step, resolved config, every piece (variable, rows, shape, dtype,
                                  slot names, file, crc32, bytes)
    ckpt-<step>/<piece files>     one file per piece: the value, then each slot in manifest order,
                                  as consecutive .npy records (`np.load` of the file gives the value)
    ckpt-<step>.partial/          staging while a save is in progress

A distributed save is two phases. Every shard calls `write_shard`, which writes its piece
files and, last, `shard-<i>.json` (the shard's part of the manifest) into the staging
directory; then the chief calls `commit`, which checks that every shard is there, writes
`manifest.json`, renames the staging directory into place and then moves `latest`. Every
file is written to a temporary name, fsynced and renamed, so a crash at any point leaves
the previous checkpoint whole and `latest` on it; leftover `.partial` directories are
ignored and removed by the next commit. Committing a step that is already committed keeps
the first one (a step's values are the same).

Restore reads by rows (`Checkpoint.read_rows`), assembling the asked range from whatever
pieces were saved, so a checkpoint restores onto another number of shards or another
partitioning. No pickle: arrays are loaded with allow_pickle=False, and a truncated or
corrupt file raises DataLossError naming it.
"""

import io
import json
import os
import re
import shutil
import zlib
from urllib.parse import quote

import numpy as np

from zmqflow.common.dtypes import as_numpy, name_of
from zmqflow.common.errors import (DataLossError, FailedPreconditionError, InvalidArgumentError, NotFoundError,
                           OutOfRangeError)
from zmqflow.common.variables import VariableSpec

FORMAT = "zmqflow-checkpoint-1"
LATEST = "latest"
MANIFEST = "manifest.json"
_COMMITTED = re.compile(r"^ckpt-(\d+)$")
_PARTIAL = re.compile(r"^ckpt-(\d+)\.partial$")


# --- writing ----------------------------------------------------------------------------

def write_shard(ckpt_dir, step, shard_index, pieces):
    """Write one shard's pieces into `ckpt_dir/ckpt-<step>.partial/`.

    `pieces`: {key: (info, value, {slot: array})}, where info is a Piece (or anything with
    `variable`, `row_start`, `row_end`, or a dict with those keys) saying which rows of
    which variable `value` holds. Returns the staging directory.
    """
    staging = os.path.join(ckpt_dir, f"ckpt-{int(step)}.partial")
    os.makedirs(staging, exist_ok=True)
    index_path = os.path.join(staging, f"shard-{int(shard_index)}.json")
    if os.path.exists(index_path):  # an earlier attempt: its files are about to be overwritten
        os.remove(index_path)
    entries = []
    for key, (info, value, slots) in pieces.items():
        entries.append(_write_piece(staging, key, _piece_info(key, info), np.asarray(value), slots or {}))
    _write_atomic(index_path, json.dumps({"step": int(step), "shard": int(shard_index), "pieces": entries},
                                         indent=1).encode())
    _fsync_dir(staging)
    return staging


def _write_piece(staging, key, info, value, slots):
    variable, row_start, row_end = info
    rows = value.shape[0] if value.ndim else 1
    if row_end - row_start != rows:
        raise InvalidArgumentError(f"piece {key!r}: rows [{row_start}, {row_end}) do not match a value of "
                                   f"shape {list(value.shape)}")
    for name, slot in slots.items():
        slot = np.asarray(slot)
        if slot.shape != value.shape or slot.dtype != value.dtype:
            raise InvalidArgumentError(f"piece {key!r}: slot {name!r} is {slot.dtype} {list(slot.shape)}, "
                                       f"expected {value.dtype} {list(value.shape)} as its variable")
    file = f"{quote(variable, safe='')}.rows-{row_start}-{row_end}.npy"
    path = os.path.join(staging, file)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as raw:
        out = _Crc32Writer(raw)
        for array in [value, *slots.values()]:
            np.save(out, np.asarray(array), allow_pickle=False)
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, path)
    return {"key": key, "variable": variable, "row_start": row_start, "row_end": row_end,
            "shape": list(value.shape), "dtype": name_of(value), "slots": list(slots), "file": file,
            "crc32": out.crc, "bytes": out.size}


def commit(ckpt_dir, step, num_shards, config, keep=5):
    """Chief: make the staged checkpoint of `step` the latest one; returns its path.

    FailedPreconditionError names the shards whose files are missing. `keep` checkpoints
    are kept (the one committed included); None or 0 keeps all.
    """
    step = int(step)
    staging = os.path.join(ckpt_dir, f"ckpt-{step}.partial")
    final = os.path.join(ckpt_dir, f"ckpt-{step}")
    if os.path.isfile(os.path.join(final, MANIFEST)):
        shutil.rmtree(staging, ignore_errors=True)
    else:
        _write_manifest(staging, step, num_shards, config)
        if os.path.exists(final):  # a half-removed directory of an old run
            shutil.rmtree(final)
        os.rename(staging, final)
        _fsync_dir(ckpt_dir)
    _write_atomic(os.path.join(ckpt_dir, LATEST), f"ckpt-{step}\n".encode())
    _prune(ckpt_dir, step, keep)
    return final


def save_params(ckpt_dir, step, params, config, keep=5):
    """Write whole variables {name: array} as a one-shard checkpoint of `step` and commit it (a model
    kept outside the ps: the best one seen in validation, a model trained in one process)."""
    pieces = {name: ({"variable": name, "row_start": 0, "row_end": value.shape[0] if value.ndim else 1}, value, {})
              for name, value in params.items()}
    write_shard(ckpt_dir, step, 0, pieces)
    return commit(ckpt_dir, step, 1, config, keep=keep)


def _write_manifest(staging, step, num_shards, config):
    try:
        config_json = json.loads(json.dumps(config))
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"checkpoint config is not JSON: {exc}") from exc
    indexes = [os.path.join(staging, f"shard-{i}.json") for i in range(num_shards)]
    missing = [i for i, path in enumerate(indexes) if not os.path.isfile(path)]
    if missing:
        raise FailedPreconditionError(f"checkpoint of step {step} in {os.path.dirname(staging)!r} misses shards "
                                      f"{', '.join(f'ps:{i}' for i in missing)} of {num_shards}")
    pieces = []
    for shard, path in enumerate(indexes):
        for entry in _read_json(path)["pieces"]:
            file = os.path.join(staging, entry["file"])
            if not os.path.isfile(file) or os.path.getsize(file) != entry["bytes"]:
                raise DataLossError(f"checkpoint file {file!r} of ps:{shard} is missing or has the wrong size")
            pieces.append({**entry, "shard": shard})
    pieces.sort(key=lambda p: (p["variable"], p["row_start"]))
    variables = _check_coverage(pieces, step)
    manifest = {"format": FORMAT, "step": step, "num_shards": num_shards, "config": config_json,
                "variables": variables, "pieces": pieces}
    _write_atomic(os.path.join(staging, MANIFEST), json.dumps(manifest, indent=1).encode())
    for path in indexes:
        os.remove(path)
    _fsync_dir(staging)


def _check_coverage(pieces, step):
    """{variable: {shape, dtype, slots}}; FailedPrecondition when the pieces leave a gap or overlap."""
    by_variable = {}
    for piece in pieces:
        by_variable.setdefault(piece["variable"], []).append(piece)
    variables = {}
    for name, group in sorted(by_variable.items()):
        group.sort(key=lambda p: p["row_start"])
        start = 0
        first = group[0]
        for piece in group:
            if piece["row_start"] != start:
                raise FailedPreconditionError(f"checkpoint of step {step}: rows of {name!r} from {start} are "
                                              f"missing or saved twice")
            if (piece["dtype"], piece["slots"], piece["shape"][1:]) != (first["dtype"], first["slots"],
                                                                         first["shape"][1:]):
                raise FailedPreconditionError(f"checkpoint of step {step}: pieces of {name!r} disagree on dtype, "
                                              f"slots or row shape")
            start = piece["row_end"]
        shape = first["shape"] if len(group) == 1 else [start] + first["shape"][1:]
        variables[name] = {"shape": shape, "dtype": first["dtype"], "slots": first["slots"]}
    return variables


def _prune(ckpt_dir, step, keep):
    """Remove all but the newest `keep` checkpoints (never `step`) and stale staging dirs below `step`."""
    committed, partial = [], []
    for name in os.listdir(ckpt_dir):
        if (m := _COMMITTED.match(name)) and int(m.group(1)) != step:
            committed.append(int(m.group(1)))
        elif (m := _PARTIAL.match(name)) and int(m.group(1)) < step:
            partial.append(name)
    old = sorted(committed)[:max(len(committed) - keep + 1, 0)] if keep else []
    for name in [f"ckpt-{s}" for s in old] + partial:
        shutil.rmtree(os.path.join(ckpt_dir, name), ignore_errors=True)


# --- reading ----------------------------------------------------------------------------

def latest_checkpoint(ckpt_dir):
    """The path of the latest committed checkpoint in `ckpt_dir`, or None.

    `latest` names it; if that file is missing or names no checkpoint, the committed
    checkpoint of the highest step is used. Staging (`.partial`) directories never count.
    """
    if not os.path.isdir(ckpt_dir):
        return None
    try:
        with open(os.path.join(ckpt_dir, LATEST), encoding="utf-8") as f:
            name = f.read().strip()
        if _COMMITTED.match(name) and os.path.isfile(os.path.join(ckpt_dir, name, MANIFEST)):
            return os.path.join(ckpt_dir, name)
    except OSError:
        pass
    steps = [int(m.group(1)) for n in os.listdir(ckpt_dir) if (m := _COMMITTED.match(n))
             and os.path.isfile(os.path.join(ckpt_dir, n, MANIFEST))]
    return os.path.join(ckpt_dir, f"ckpt-{max(steps)}") if steps else None


class Checkpoint:
    """A committed checkpoint: its step, config and variables, read by rows."""

    def __init__(self, path):
        self.path = os.fspath(path)
        manifest_path = os.path.join(self.path, MANIFEST)
        if not os.path.isfile(manifest_path):
            raise NotFoundError(f"{self.path!r} is not a checkpoint: it has no {MANIFEST}")
        self.manifest = _read_json(manifest_path)
        try:
            self.step = int(self.manifest["step"])
            self.config = self.manifest["config"]
            self.num_shards = int(self.manifest["num_shards"])
            self._variables = self.manifest["variables"]
            self._pieces = {}
            for piece in self.manifest["pieces"]:
                self._pieces.setdefault(piece["variable"], []).append(piece)
        except (KeyError, TypeError, ValueError) as exc:
            raise DataLossError(f"checkpoint manifest {manifest_path!r} is malformed: {exc!r}") from exc

    def variables(self):
        """VariableSpec of every saved variable (whole shape), sorted by name."""
        return [VariableSpec(name, tuple(v["shape"]), v["dtype"]) for name, v in sorted(self._variables.items())]

    def slot_names(self, variable):
        return list(self._variable(variable)["slots"])

    def read(self, variable):
        """(value, {slot: array}) of the whole variable."""
        shape = self._variable(variable)["shape"]
        return self.read_rows(variable, 0, shape[0] if shape else 1)

    def read_rows(self, variable, row_start, row_end):
        """(value, {slot: array}) of rows [row_start, row_end) of `variable`, from whichever pieces hold them.

        A scalar variable has one row: read_rows(v, 0, 1) gives it with shape ().
        """
        info = self._variable(variable)
        rows = info["shape"][0] if info["shape"] else 1
        if not 0 <= row_start <= row_end <= rows:
            raise OutOfRangeError(f"rows [{row_start}, {row_end}) are outside [0, {rows}) of {variable!r}")
        if row_start == row_end:  # nothing to read: empty arrays of the right shape
            empty = np.zeros((0,) + tuple(info["shape"][1:]), as_numpy(info["dtype"]))
            return empty, {name: empty.copy() for name in info["slots"]}
        values, slots = [], {name: [] for name in info["slots"]}
        for piece in sorted(self._pieces[variable], key=lambda p: p["row_start"]):
            lo, hi = max(row_start, piece["row_start"]), min(row_end, piece["row_end"])
            if lo >= hi:
                continue
            cut = slice(lo - piece["row_start"], hi - piece["row_start"])
            arrays = [a[cut] if a.ndim else a for a in self._load_piece(piece)]
            values.append(arrays[0])
            for name, array in zip(piece["slots"], arrays[1:]):
                slots[name].append(array)
        return _join(values), {name: _join(parts) for name, parts in slots.items()}

    def _variable(self, variable):
        if variable not in self._variables or variable not in self._pieces:
            raise NotFoundError(f"variable {variable!r} is not in checkpoint {self.path!r}")
        return self._variables[variable]

    def _load_piece(self, piece):
        """[value, *slots] of one piece file, checked against the manifest's size, checksum, shape and dtype."""
        path = os.path.join(self.path, piece["file"])
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise DataLossError(f"checkpoint file {path!r} cannot be read: {exc}") from exc
        if len(data) != piece["bytes"] or zlib.crc32(data) != piece["crc32"]:
            raise DataLossError(f"checkpoint file {path!r} is truncated or corrupt (size or crc32 mismatch)")
        stream, dtype, arrays = io.BytesIO(data), as_numpy(piece["dtype"]), []
        try:
            for _ in range(1 + len(piece["slots"])):
                array = np.load(stream, allow_pickle=False)
                if array.dtype != dtype and array.dtype.kind == "V":  # bfloat16 is saved as raw bytes
                    array = array.view(dtype)
                if array.shape != tuple(piece["shape"]) or array.dtype != dtype:
                    raise ValueError(f"holds {array.dtype} {list(array.shape)}")
                arrays.append(array)
        except (ValueError, EOFError, OSError) as exc:
            raise DataLossError(f"checkpoint file {path!r} is corrupt: {exc}") from exc
        return arrays


def _join(parts):
    """One writable array from row blocks (np.load's arrays are read-only views of the file's bytes)."""
    return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)


# --- files ------------------------------------------------------------------------------

class _Crc32Writer:
    """A file wrapper that keeps the crc32 and size of what passes through it."""

    def __init__(self, raw):
        self.raw, self.crc, self.size = raw, 0, 0

    def write(self, data):
        self.crc = zlib.crc32(data, self.crc)
        self.size += len(data)
        return self.raw.write(data)


def _piece_info(key, info):
    """(variable, row_start, row_end) from a Piece-like object or a dict."""
    get = info.get if isinstance(info, dict) else (lambda k: getattr(info, k, None))
    variable, start, end = get("variable"), get("row_start"), get("row_end")
    integers = (int, np.integer)
    if not isinstance(variable, str) or not isinstance(start, integers) or not isinstance(end, integers) \
            or not 0 <= start <= end:
        raise InvalidArgumentError(f"piece {key!r} needs a variable name and a row range, got {info!r}")
    return variable, int(start), int(end)


def _write_atomic(path, data):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path) or ".")


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise DataLossError(f"checkpoint file {path!r} cannot be read: {exc}") from exc
