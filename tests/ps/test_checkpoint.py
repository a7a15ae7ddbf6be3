"""Checkpoints: save from some shards, restore onto others; atomic commit, keep-K, corruption, missing shards."""

import json
import os

import numpy as np
import pytest

from zmqflow.common.errors import DataLossError, FailedPreconditionError, NotFoundError, OutOfRangeError
from zmqflow.common.variables import VariableSpec
from zmqflow.common.cluster.placement import place
from zmqflow.common.checkpoints import checkpoint
from zmqflow.common.checkpoints.checkpoint import Checkpoint, commit, latest_checkpoint, write_shard

pytestmark = pytest.mark.unit

VARIABLES = [VariableSpec("emb", (10, 3)), VariableSpec("hidden/weights", (6, 4)),
             VariableSpec("hidden/biases", (4,)), VariableSpec("step_scale", ())]
CONFIG = {"optimizer": {"kind": "momentum", "learning_rate": 0.1, "momentum": 0.9}, "num_ps": 2}


def model_state(seed=0):
    """Values and one 'momentum' slot per variable."""
    rng = np.random.default_rng(seed)
    values = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in VARIABLES}
    slots = {v.name: {"momentum": rng.standard_normal(v.shape).astype(np.float32)} for v in VARIABLES}
    return values, slots


def write_all_shards(ckpt_dir, step, placement, values, slots, only=None):
    """What every ps shard does on `save`: its pieces, cut from the whole model."""
    for shard in range(placement.num_shards) if only is None else only:
        pieces = {}
        for p in placement.for_shard(shard):
            rows = slice(p.row_start, p.row_end) if p.shape else ()
            pieces[p.key] = (p, values[p.variable][rows], {k: s[rows] for k, s in slots[p.variable].items()})
        write_shard(str(ckpt_dir), step, shard, pieces)


def save(ckpt_dir, step, placement, values, slots, keep=5):
    write_all_shards(ckpt_dir, step, placement, values, slots)
    return commit(str(ckpt_dir), step, placement.num_shards, CONFIG, keep=keep)


def restore(path, placement):
    """What every ps shard does on `restore`: read its rows, then put the model together again."""
    ckpt = Checkpoint(path)
    values, slots = {}, {}
    for p in placement:
        value, piece_slots = ckpt.read_rows(p.variable, p.row_start, p.row_end)
        assert value.shape == p.shape and value.flags.writeable
        values[p.key], slots[p.key] = value, piece_slots["momentum"]
    return ({v: placement.assemble(v, values) for v in placement.variables()},
            {v: placement.assemble(v, slots) for v in placement.variables()})


def test_save_from_two_shards_restore_onto_one_and_three(tmp_path):
    values, slots = model_state()
    saved_on = place(VARIABLES, 2, "round_robin", max_shard_bytes=48)  # emb in 3 blocks, weights in 2
    assert len(saved_on.pieces_of("emb")) == 3
    path = save(tmp_path, 100, saved_on, values, slots)
    assert latest_checkpoint(str(tmp_path)) == path == os.path.join(str(tmp_path), "ckpt-100")

    for restored_on in (place(VARIABLES, 1), place(VARIABLES, 3, "greedy", max_shard_bytes=30)):
        got_values, got_slots = restore(path, restored_on)
        for name in values:
            np.testing.assert_array_equal(got_values[name], values[name])
            np.testing.assert_array_equal(got_slots[name], slots[name]["momentum"])

    ckpt = Checkpoint(path)
    assert ckpt.step == 100 and ckpt.config == CONFIG and ckpt.num_shards == 2
    assert ckpt.variables() == sorted(VARIABLES, key=lambda v: v.name)
    value, ckpt_slots = ckpt.read("step_scale")
    assert value.shape == () and value == values["step_scale"]
    np.testing.assert_array_equal(ckpt.read_rows("emb", 2, 9)[0], values["emb"][2:9])  # across 3 pieces


def test_manifest_lists_every_piece_and_file_with_a_checksum(tmp_path):
    values, slots = model_state()
    path = save(tmp_path, 7, place(VARIABLES, 2, max_shard_bytes=48), values, slots)
    manifest = json.loads(open(os.path.join(path, "manifest.json")).read())
    assert manifest["format"] == "zmqflow-checkpoint-2"
    emb = [p for p in manifest["pieces"] if p["variable"] == "emb"]
    assert [(p["row_start"], p["row_end"], p["shard"], p["file"]) for p in emb] == [
        (0, 4, 0, "shard-0.safetensors"), (4, 7, 1, "shard-1.safetensors"), (7, 10, 0, "shard-0.safetensors")]
    assert [p["tensor"] for p in emb] == ["emb/rows_0_4", "emb/rows_4_7", "emb/rows_7_10"]
    assert emb[0]["slot_tensors"] == {"momentum": "emb/rows_0_4/slot/momentum"}
    assert all(p["slots"] == ["momentum"] and p["dtype"] == "float32" for p in emb)
    assert manifest["variables"]["emb"] == {"shape": [10, 3], "dtype": "float32", "slots": ["momentum"]}
    files = manifest["files"]
    assert sorted(files) == ["shard-0.safetensors", "shard-1.safetensors"]
    assert all(isinstance(f["crc32"], int) and f["bytes"] == os.path.getsize(os.path.join(path, name))
               for name, f in files.items())
    assert sorted(os.listdir(path)) == sorted(["manifest.json", *files])


def test_a_save_that_dies_before_commit_leaves_latest_on_the_previous(tmp_path):
    values, slots = model_state(0)
    placement = place(VARIABLES, 2)
    first = save(tmp_path, 10, placement, values, slots)
    new_values, new_slots = model_state(1)
    write_all_shards(tmp_path, 20, placement, new_values, new_slots, only=[0])  # ps:1 and the chief die
    assert latest_checkpoint(str(tmp_path)) == first
    np.testing.assert_array_equal(Checkpoint(first).read("emb")[0], values["emb"])
    # the next successful save cleans the stale staging directory up
    save(tmp_path, 30, placement, new_values, new_slots)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-10", "ckpt-30", "latest"]


def test_missing_shard_is_a_failed_precondition_naming_it(tmp_path):
    values, slots = model_state()
    placement = place(VARIABLES, 3)
    write_all_shards(tmp_path, 5, placement, values, slots, only=[1])
    with pytest.raises(FailedPreconditionError, match="ps:0, ps:2 of 3"):
        commit(str(tmp_path), 5, 3, CONFIG)
    assert latest_checkpoint(str(tmp_path)) is None


def test_keep_k_prunes_the_oldest(tmp_path):
    values, slots = model_state()
    placement = place(VARIABLES, 2)
    for step in (1, 2, 3, 4, 5):
        save(tmp_path, step, placement, values, slots, keep=3)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-3", "ckpt-4", "ckpt-5", "latest"]
    assert open(tmp_path / "latest").read().strip() == "ckpt-5"
    save(tmp_path, 6, placement, values, slots, keep=None)  # None keeps all
    assert len([n for n in os.listdir(tmp_path) if n.startswith("ckpt-")]) == 4


def test_committing_a_step_twice_keeps_the_first(tmp_path):
    values, slots = model_state()
    placement = place(VARIABLES, 1)
    path = save(tmp_path, 3, placement, values, slots)
    assert save(tmp_path, 3, placement, values, slots) == path
    assert sorted(os.listdir(tmp_path)) == ["ckpt-3", "latest"]


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_file_is_data_loss_naming_it(tmp_path, damage):
    values, slots = model_state()
    path = save(tmp_path, 1, place(VARIABLES, 2), values, slots)
    name = next(p["file"] for p in Checkpoint(path).manifest["pieces"] if p["variable"] == "hidden/weights")
    data = bytearray(open(os.path.join(path, name), "rb").read())
    if damage == "truncate":
        data = data[:len(data) // 2]
    else:
        data[-5] ^= 0xFF
    open(os.path.join(path, name), "wb").write(bytes(data))
    with pytest.raises(DataLossError, match=name):
        Checkpoint(path).read("hidden/weights")
    manifest = Checkpoint(path).manifest
    other = next(p["variable"] for p in manifest["pieces"] if p["shard"] != manifest["files"][name]["shard"])
    np.testing.assert_array_equal(Checkpoint(path).read(other)[0], values[other])  # the other shard's still read


def test_corrupt_manifest_is_data_loss(tmp_path):
    values, slots = model_state()
    path = save(tmp_path, 1, place(VARIABLES, 1), values, slots)
    with open(os.path.join(path, "manifest.json"), "w") as f:
        f.write('{"step": 1, "pie')
    with pytest.raises(DataLossError, match="manifest.json"):
        Checkpoint(path)


def test_reading_what_is_not_there(tmp_path):
    assert latest_checkpoint(str(tmp_path / "nothing")) is None
    with pytest.raises(NotFoundError):
        Checkpoint(str(tmp_path))
    values, slots = model_state()
    ckpt = Checkpoint(save(tmp_path, 1, place(VARIABLES, 1), values, slots))
    with pytest.raises(NotFoundError):
        ckpt.read("nope")
    with pytest.raises(OutOfRangeError):
        ckpt.read_rows("emb", 5, 11)


def test_latest_falls_back_to_the_newest_committed(tmp_path):
    values, slots = model_state()
    save(tmp_path, 4, place(VARIABLES, 1), values, slots)
    save(tmp_path, 8, place(VARIABLES, 1), values, slots)
    os.remove(tmp_path / "latest")
    os.makedirs(tmp_path / "ckpt-9.partial")
    assert latest_checkpoint(str(tmp_path)) == os.path.join(str(tmp_path), "ckpt-8")
    assert checkpoint.LATEST == "latest"
