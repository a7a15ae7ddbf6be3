"""Rewrite checkpoints of the first format (.npy piece files) as safetensors ones, same step, config and shards.

Old checkpoints restore as they are; converting them makes them open without zmqflow. In place, each
converted checkpoint replaces the old one under the same name, so `latest` and every `--checkpoint`
flag keep pointing at it (the new one is written and committed beside it first; the old one is moved
to `ckpt-<step>.npy-format` for the instant of the swap).
"""

import os
import re
import shutil
import tempfile

from zmqflow.common.checkpoints import npy_format as checkpoint_npy
from zmqflow.common.checkpoints.checkpoint import MANIFEST, Checkpoint, commit, file_metadata, find_checkpoint, write_shard

_COMMITTED = re.compile(r"^ckpt-(\d+)$")


def committed_checkpoints(directory):
    """The committed checkpoints `directory` stands for: itself when it is one (`ckpt-<step>`), else those in
    it, oldest first and the one `latest` names last. NotFoundError when there is none."""
    latest = find_checkpoint(directory)
    if latest == os.path.normpath(directory):
        return [latest]
    paths = [os.path.join(directory, n) for n in os.listdir(directory)
             if _COMMITTED.match(n) and os.path.isfile(os.path.join(directory, n, MANIFEST))]
    return sorted(paths, key=lambda p: (p == latest, int(_COMMITTED.match(os.path.basename(p)).group(1))))


def convert(directory, out=None):
    """Convert every first-format checkpoint of `directory` into `out` (default: in place); returns
    [(source, written path or None when it already was in the new format)]."""
    done = []
    for path in committed_checkpoints(directory):
        old = Checkpoint(path)
        if old.format != checkpoint_npy.FORMAT:
            if out is not None:
                shutil.copytree(path, os.path.join(out, os.path.basename(path)), symlinks=True, dirs_exist_ok=True)
                commit(out, old.step, old.num_shards, old.config, keep=None)
            done.append((path, None))
            continue
        if out is not None:
            done.append((path, _rewrite(old, out)))
            continue
        parent = os.path.dirname(os.path.abspath(path))
        scratch = tempfile.mkdtemp(prefix=".convert-", dir=parent)
        try:
            written = _rewrite(old, scratch)
            aside = f"{path}.npy-format"
            os.rename(path, aside)
            os.rename(written, path)
            shutil.rmtree(aside)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        done.append((path, path))
    return done


def _rewrite(old, out):
    """Write the pieces of `old` as its shards saved them, into `out`, and commit them there."""
    by_shard = {shard: {} for shard in range(old.num_shards)}
    whole = {v.name: v.shape[0] if v.shape else 1 for v in old.variables()}
    for piece in old.manifest["pieces"]:
        value, slots = old.read_rows(piece["variable"], piece["row_start"], piece["row_end"])
        is_whole = piece["row_start"] == 0 and piece["row_end"] == whole[piece["variable"]]
        info = {"variable": piece["variable"], "row_start": piece["row_start"], "row_end": piece["row_end"],
                "num_parts": 1 if is_whole else None}
        by_shard[int(piece["shard"])][piece["key"]] = (info, value, slots)
    for shard, pieces in by_shard.items():
        write_shard(out, old.step, shard, pieces, metadata=file_metadata(old.config))
    return commit(out, old.step, old.num_shards, old.config, keep=None)
