"""Checkpoints of the ps shards: per variable piece, atomic, restorable onto any placement.

Layout of a checkpoint directory:

    latest                        "ckpt-<step>": the newest committed checkpoint (replaced atomically)
    ckpt-<step>/manifest.json     step, resolved config, every file (shard, crc32, bytes) and every piece
                                  (variable, rows, shape, dtype, slots, file, tensor names)
    ckpt-<step>/shard-<i>.safetensors
                                  ps i's pieces: `<variable>` (a whole variable) or
                                  `<variable>/rows_<start>_<stop>` (a row block), each slot as
                                  `<piece>/slot/<slot>`; its metadata repeats the step, the shard,
                                  the tensor -> (variable, rows, slot) mapping and the model;
                                  the shard's shared variables (`session.variable` in a container) as
                                  `@shared/<k>`, listed under the manifest's `shared` by container and name
    ckpt-<step>.partial/          staging while a save is in progress

The tensor files are safetensors, so a checkpoint opens without zmqflow
(`safetensors.numpy.load_file`, `safetensors.torch.load_file`, JAX through numpy).

A distributed save is two phases. Every shard calls `write_shard`, which writes its tensor
file and, last, `shard-<i>.json` (the shard's part of the manifest) into the staging
directory; then the chief calls `commit`, which checks that every shard is there, writes
`manifest.json`, renames the staging directory into place and then moves `latest`. Every
file is written to a temporary name, fsynced and renamed, so a crash at any point leaves
the previous checkpoint whole and `latest` on it; leftover `.partial` directories are
ignored and removed by the next commit. Committing a step that is already committed keeps
the first one (a step's values are the same).

Restore reads by rows (`Checkpoint.read_rows`), assembling the asked range from whatever
pieces were saved, so a checkpoint restores onto another number of shards or another
partitioning. A truncated or corrupt file raises DataLossError naming it. Checkpoints of
the first format (one .npy-records file per piece, `checkpoint_npy`) still restore.
"""

import json
import os
import re
import shutil
import zlib

import numpy as np

from zmqflow.common.checkpoints import npy_format as checkpoint_npy, safetensors_file
from zmqflow.common.wire.dtypes import as_numpy, name_of
from zmqflow.common.errors import (DataLossError, FailedPreconditionError, InvalidArgumentError, NotFoundError,
                           OutOfRangeError)
from zmqflow.common.variables import VariableSpec

FORMAT = "zmqflow-checkpoint-2"
FORMATS = (FORMAT, checkpoint_npy.FORMAT)
LATEST = "latest"
MANIFEST = "manifest.json"
_COMMITTED = re.compile(r"^ckpt-(\d+)$")
_PARTIAL = re.compile(r"^ckpt-(\d+)\.partial$")


# --- writing ----------------------------------------------------------------------------

def staging_name(step):
    """The folder the shards of checkpoint `step` are written into before it is committed."""
    return f"ckpt-{int(step)}.partial"


def write_shard(ckpt_dir, step, shard_index, pieces, metadata=None, shared=None):
    """Write one shard's pieces into `ckpt_dir/ckpt-<step>.partial/shard-<i>.safetensors`.

    `pieces`: {key: (info, value, {slot: array})}, where info is a Piece (or anything with
    `variable`, `row_start`, `row_end`, or a dict with those keys) saying which rows of
    which variable `value` holds. `metadata` ({str: str}, e.g. the model) goes into the
    file's header too. `shared` ({(container, name): array}) are the shard's shared variables, kept beside
    the model's pieces (restored by name, wherever the placement puts them then). Returns the staging directory.
    """
    staging = os.path.join(ckpt_dir, staging_name(step))
    os.makedirs(staging, exist_ok=True)
    index_path = os.path.join(staging, f"shard-{int(shard_index)}.json")
    if os.path.exists(index_path):  # an earlier attempt: its file is about to be overwritten
        os.remove(index_path)
    entries, tensors, mapping = [], {}, {}
    for key, (info, value, slots) in pieces.items():
        entry, named = _piece_tensors(key, info, np.asarray(value), slots or {})
        clash = sorted(set(named) & set(tensors))
        if clash:
            raise InvalidArgumentError(f"piece {key!r}: tensor name {clash[0]!r} is used twice in shard {shard_index}")
        for name, (array, slot) in named.items():
            tensors[name] = array
            mapping[name] = {"variable": entry["variable"], "rows": [entry["row_start"], entry["row_end"]],
                             "slot": slot}
        entries.append(entry)
    shared_entries = []
    for k, ((container, name), value) in enumerate(sorted((shared or {}).items())):
        tensor = f"@shared/{k}"
        if tensor in tensors:
            raise InvalidArgumentError(f"tensor name {tensor!r} is used twice in shard {shard_index}")
        tensors[tensor] = value = np.asarray(value)
        shared_entries.append({"container": container, "name": name, "tensor": tensor, "shape": list(value.shape),
                               "dtype": name_of(value)})
    file = f"shard-{int(shard_index)}.safetensors"
    header = {**(metadata or {}), "format": FORMAT, "step": str(int(step)), "shard": str(int(shard_index)),
              "tensors": json.dumps(mapping, separators=(",", ":"))}
    data = safetensors_file.encode(tensors, header)
    _write_atomic(os.path.join(staging, file), data, sync_dir=False)
    for entry in entries + shared_entries:
        entry["file"] = file
    _write_atomic(index_path, json.dumps({"step": int(step), "shard": int(shard_index),
                                          "files": {file: {"crc32": zlib.crc32(data), "bytes": len(data)}},
                                          "pieces": entries, "shared": shared_entries}, indent=1).encode())
    return staging


def file_metadata(config):
    """What a tensor file's header repeats of the resolved config, for readers without the manifest:
    the model spec (JSON) and the data spec's name."""
    config = config or {}
    metadata = {}
    if config.get("model") is not None:
        metadata["model"] = json.dumps(config["model"], sort_keys=True, separators=(",", ":"))
    spec = (config.get("data") or {}).get("spec") if isinstance(config.get("data"), dict) else None
    if isinstance(spec, dict) and spec.get("name"):
        metadata["data"] = str(spec["name"])
    return metadata


def _piece_tensors(key, info, value, slots):
    """(manifest entry, {tensor name: (array, slot or None)}) of one piece: a whole variable is stored
    under its own name, a row block as `<variable>/rows_<start>_<stop>`, a slot as `<that>/slot/<slot>`."""
    variable, row_start, row_end = _piece_info(key, info)
    rows = value.shape[0] if value.ndim else 1
    if row_end - row_start != rows:
        raise InvalidArgumentError(f"piece {key!r}: rows [{row_start}, {row_end}) do not match a value of "
                                   f"shape {list(value.shape)}")
    for name, slot in slots.items():
        slot = np.asarray(slot)
        if slot.shape != value.shape or slot.dtype != value.dtype:
            raise InvalidArgumentError(f"piece {key!r}: slot {name!r} is {slot.dtype} {list(slot.shape)}, "
                                       f"expected {value.dtype} {list(value.shape)} as its variable")
    tensor = variable if _is_whole(info) else f"{variable}/rows_{row_start}_{row_end}"
    slot_tensors = {name: f"{tensor}/slot/{name}" for name in slots}
    named = {tensor: (value, None), **{slot_tensors[n]: (np.asarray(s), n) for n, s in slots.items()}}
    entry = {"key": key, "variable": variable, "row_start": row_start, "row_end": row_end,
             "shape": list(value.shape), "dtype": name_of(value), "slots": list(slots), "tensor": tensor,
             "slot_tensors": slot_tensors}
    return entry, named


def _is_whole(info):
    """Whether a piece is its whole variable: a Piece of one part, or a dict saying `num_parts: 1`."""
    parts = info.get("num_parts") if isinstance(info, dict) else getattr(info, "num_parts", None)
    return parts == 1


def commit(ckpt_dir, step, num_shards, config, keep=5):
    """Chief: make the staged checkpoint of `step` the latest one; returns its path.

    FailedPreconditionError names the shards whose files are missing. `keep` checkpoints
    are kept (the one committed included); None or 0 keeps all.
    """
    step = int(step)
    staging = os.path.join(ckpt_dir, staging_name(step))
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


def save_params(ckpt_dir, step, params, config, keep=5, slots=None):
    """Write whole variables {name: array} (and their optimizer `slots`, {name: {slot: array}}) as a one-shard
    checkpoint of `step` and commit it (a model kept outside the ps: the best one seen in validation, a model
    trained in one process, an all-reduce chief's replica)."""
    slots = slots or {}
    pieces = {name: ({"variable": name, "row_start": 0, "row_end": value.shape[0] if value.ndim else 1,
                      "num_parts": 1}, value, slots.get(name, {})) for name, value in params.items()}
    write_shard(ckpt_dir, step, 0, pieces, metadata=file_metadata(config))
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
    files, pieces, shared = {}, [], []
    for shard, path in enumerate(indexes):
        index = _read_json(path)
        for name, info in index["files"].items():
            file = os.path.join(staging, name)
            if not os.path.isfile(file) or os.path.getsize(file) != info["bytes"]:
                raise DataLossError(f"checkpoint file {file!r} of ps:{shard} is missing or has the wrong size")
            files[name] = {"shard": shard, **info}
        pieces.extend({**entry, "shard": shard} for entry in index["pieces"])
        shared.extend({**entry, "shard": shard} for entry in index.get("shared", []))
    pieces.sort(key=lambda p: (p["variable"], p["row_start"]))
    variables = _check_coverage(pieces, step)
    manifest = {"format": FORMAT, "step": step, "num_shards": num_shards, "config": config_json,
                "variables": variables, "files": files, "pieces": pieces,
                "shared": sorted(shared, key=lambda e: (e["container"], e["name"]))}
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


def find_checkpoint(directory):
    """The checkpoint `directory` names: itself when it is one (a `ckpt-<step>` with its manifest), else
    the latest committed one in it; NotFound when it is neither."""
    directory = os.fspath(directory)
    if os.path.isfile(os.path.join(directory, MANIFEST)):
        return os.path.normpath(directory)
    path = latest_checkpoint(directory)
    if path is None:
        raise NotFoundError(f"no committed checkpoint in {directory!r}: it is no ckpt-<step> (no {MANIFEST}) and "
                            "holds none")
    return path


class Checkpoint:
    """A committed checkpoint: its step, config and variables, read by rows."""

    def __init__(self, path):
        self.path = os.fspath(path)
        manifest_path = os.path.join(self.path, MANIFEST)
        if not os.path.isfile(manifest_path):
            raise NotFoundError(f"{self.path!r} is not a checkpoint: it has no {MANIFEST}")
        self.manifest = _read_json(manifest_path)
        self._files = {}  # file name -> {tensor name: array}, each file read and checked once
        try:
            self.format = self.manifest.get("format", checkpoint_npy.FORMAT)
            if self.format not in FORMATS:
                raise ValueError(f"format {self.format!r} is none of {', '.join(FORMATS)}")
            self.step = int(self.manifest["step"])
            self.config = self.manifest["config"]
            self.num_shards = int(self.manifest["num_shards"])
            self._variables = self.manifest["variables"]
            self._pieces = {}
            for piece in self.manifest["pieces"]:
                self._pieces.setdefault(piece["variable"], []).append(piece)
            self._shared = {(e["container"], e["name"]): e for e in self.manifest.get("shared", [])}
        except (KeyError, TypeError, ValueError) as exc:
            raise DataLossError(f"checkpoint manifest {manifest_path!r} is malformed: {exc!r}") from exc

    def variables(self):
        """VariableSpec of every saved variable (whole shape), sorted by name."""
        return [VariableSpec(name, tuple(v["shape"]), v["dtype"]) for name, v in sorted(self._variables.items())]

    def shared_variables(self):
        """(container, name) of every shared variable saved (none in a checkpoint from before them)."""
        return sorted(self._shared)

    def read_shared(self, container, name):
        """The saved value of shared variable `name` of `container`, checked against the manifest."""
        entry = self._shared.get((container, name))
        if entry is None:
            raise NotFoundError(f"shared variable {name!r} of container {container!r} is not in checkpoint "
                                f"{self.path!r}")
        array = self._load_file(entry.get("file")).get(entry.get("tensor"))
        if array is None or list(array.shape) != entry.get("shape") or name_of(array) != entry.get("dtype"):
            found = "nothing" if array is None else f"{name_of(array)} {list(array.shape)}"
            raise DataLossError(f"checkpoint {self.path!r}: shared variable {name!r} of container {container!r} "
                                f"holds {found}, the manifest says {entry.get('dtype')} {entry.get('shape')}")
        return array.copy()

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
        """[value, *slots] of one piece, checked against the manifest's shape and dtype."""
        if self.format == checkpoint_npy.FORMAT:
            return checkpoint_npy.load_npy_piece(self._file_path(piece.get("file")), piece)
        path = self._file_path(piece.get("file"))
        try:
            names = [piece["tensor"]] + [piece["slot_tensors"][slot] for slot in piece["slots"]]
        except (KeyError, TypeError) as exc:
            raise DataLossError(f"checkpoint manifest of {self.path!r} names no tensor for a piece of "
                                f"{piece.get('variable')!r}: {exc!r}") from exc
        tensors = self._load_file(piece["file"])
        arrays = []
        for name in names:
            array = tensors.get(name)
            if array is None or array.shape != tuple(piece["shape"]) or name_of(array) != piece["dtype"]:
                found = "nothing" if array is None else f"{name_of(array)} {list(array.shape)}"
                raise DataLossError(f"checkpoint file {path!r}: tensor {name!r} holds {found}, the manifest says "
                                    f"{piece['dtype']} {piece['shape']}")
            arrays.append(array)
        return arrays

    def _file_path(self, name):
        """The path of a file the manifest names, which must lie inside the checkpoint directory: a relative
        name without `..` whose real path (symlinks followed) stays inside; DataLossError otherwise, as for
        any malformed manifest, so a crafted one reads no file outside its checkpoint."""
        root = os.path.realpath(self.path)
        if not isinstance(name, str) or not name or os.path.isabs(name) or ".." in name.split("/"):
            raise DataLossError(f"checkpoint manifest of {self.path!r} names the file {name!r}: a file of a checkpoint "
                                "is a relative name inside its directory")
        path = os.path.join(self.path, name)
        if os.path.commonpath([root, os.path.realpath(path)]) != root:
            raise DataLossError(f"checkpoint manifest of {self.path!r} names the file {name!r}, a link to "
                                f"{os.path.realpath(path)!r} outside the checkpoint directory")
        return path

    def _load_file(self, name):
        """{tensor name: array} of one tensor file, read once and checked against the manifest's size and crc32."""
        if name not in self._files:
            path = self._file_path(name)
            info = self.manifest["files"].get(name)
            if info is None:
                raise DataLossError(f"checkpoint manifest {os.path.join(self.path, MANIFEST)!r} lists no file {name!r}")
            data = checkpoint_npy.read_checked(path, info["bytes"], info["crc32"])
            self._files[name] = safetensors_file.decode(data, path)[1]
        return self._files[name]


def _join(parts):
    """One writable array from row blocks (np.load's arrays are read-only views of the file's bytes)."""
    return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)


# --- files ------------------------------------------------------------------------------

def _piece_info(key, info):
    """(variable, row_start, row_end) from a Piece-like object or a dict."""
    get = info.get if isinstance(info, dict) else (lambda k: getattr(info, k, None))
    variable, start, end = get("variable"), get("row_start"), get("row_end")
    integers = (int, np.integer)
    if not isinstance(variable, str) or not isinstance(start, integers) or not isinstance(end, integers) \
            or not 0 <= start <= end:
        raise InvalidArgumentError(f"piece {key!r} needs a variable name and a row range, got {info!r}")
    return variable, int(start), int(end)


def _write_atomic(path, data, sync_dir=True):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync_dir:
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
