"""Portable checkpoints: safetensors files that open without zmqflow (numpy, PyTorch, JAX), every dtype
round-tripped, first-format checkpoints restored and converted, `zmqflow checkpoint inspect`."""

import json
import os
import zlib

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.numpy import load_file

from zmqflow.cli.main import main
from zmqflow.common.checkpoints import npy_format as checkpoint_npy, safetensors_file
from zmqflow.common.checkpoints.checkpoint import Checkpoint, commit, latest_checkpoint, save_params, write_shard
from zmqflow.common.errors import DataLossError
from zmqflow.common.cluster.placement import place
from zmqflow.common.processes.children import start_service
from zmqflow.common.clients.ps import PsClient
from zmqflow.common.variables import VariableSpec
from zmqflow.models.registry import load_model, model_variables
from zmqflow.models.spec import MNIST_MLP

pytestmark = pytest.mark.unit

MOMENTUM = json.dumps({"kind": "momentum", "learning_rate": 0.1, "momentum": 0.9})
CONFIG = {"model": MNIST_MLP, "data": {"spec": {"name": "mnist"}, "stats": {}}}


@pytest.fixture(scope="module")
def ps_checkpoint(tmp_path_factory):
    """A checkpoint saved by two real ps shards (momentum slots) after one step, with the values they held."""
    tmp = tmp_path_factory.mktemp("ps")
    procs = [start_service("zmqflow.services.ps", ["--task-index", str(i), "--num-ps", "2", "--model",
                                                   json.dumps(MNIST_MLP), "--optimizer", MOMENTUM,
                                                   "--checkpoint-root", str(tmp)], log_dir=str(tmp))
             for i in range(2)]
    try:
        ps = PsClient([p.endpoint for p in procs], place(model_variables(MNIST_MLP), 2))
        initial = load_model(MNIST_MLP).initial_values(1)
        ps.initialize(initial)
        ps.pull()
        ps.push({k: np.full_like(v, 0.5) for k, v in initial.items()})
        trained = ps.pull()
        path = ps.save(str(tmp / "ckpt"), config=CONFIG)
    finally:
        for p in procs:
            p.stop()
    return str(tmp / "ckpt"), path, trained


def shard_files(path):
    return sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".safetensors"))


@pytest.mark.service
def test_a_ps_checkpoint_opens_with_safetensors_numpy(ps_checkpoint):
    _, path, trained = ps_checkpoint
    files = shard_files(path)
    assert [os.path.basename(f) for f in files] == ["shard-0.safetensors", "shard-1.safetensors"]
    loaded = {}
    for file in files:
        loaded.update(load_file(file))
        with safe_open(file, framework="np") as f:
            metadata = f.metadata()
        assert metadata["step"] == "1" and json.loads(metadata["model"]) == MNIST_MLP and metadata["data"] == "mnist"
        assert {t["variable"] for t in json.loads(metadata["tensors"]).values()} <= set(trained)
    assert set(trained) <= set(loaded)  # a user sees the variables under their own names
    for name, value in trained.items():
        np.testing.assert_array_equal(loaded[name], value)
        assert loaded[f"{name}/slot/momentum"].shape == value.shape
        np.testing.assert_allclose(loaded[f"{name}/slot/momentum"], 0.5)  # one step of gradient 0.5


@pytest.mark.service
def test_a_ps_checkpoint_restores_onto_another_shard_count(ps_checkpoint, tmp_path):
    directory, _, trained = ps_checkpoint
    (one,) = [start_service("zmqflow.services.ps", ["--task-index", "0", "--num-ps", "1", "--model",
                                                    json.dumps(MNIST_MLP), "--optimizer", MOMENTUM,
                                                    "--restore-from", directory], log_dir=str(tmp_path))]
    try:
        ps = PsClient([one.endpoint], place(model_variables(MNIST_MLP), 1))
        restored = ps.pull()
        assert ps.versions == [1]
        for name, value in trained.items():
            np.testing.assert_array_equal(restored[name], value)
    finally:
        one.stop()


@pytest.mark.service
@pytest.mark.torch
def test_a_ps_checkpoint_opens_with_pytorch(ps_checkpoint):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (make test-torch)")
    from safetensors.torch import load_file as torch_load_file
    _, path, trained = ps_checkpoint
    loaded = {}
    for file in shard_files(path):
        loaded.update(torch_load_file(file))
    for name, value in trained.items():
        assert loaded[name].dtype == torch.float32
        np.testing.assert_array_equal(loaded[name].numpy(), value)


@pytest.mark.service
def test_a_ps_checkpoint_opens_with_jax(ps_checkpoint):
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    _, path, trained = ps_checkpoint
    params = {}
    for file in shard_files(path):
        params.update({name: jnp.asarray(array) for name, array in load_file(file).items()})
    for name, value in trained.items():
        np.testing.assert_array_equal(np.asarray(params[name]), value)


DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "bool"]


def every_dtype():
    rng = np.random.default_rng(3)
    return {f"v/{name}": (rng.standard_normal((5, 2)) * 10).astype(ml_dtypes.bfloat16 if name == "bfloat16" else name)
            for name in DTYPES}


def test_every_dtype_round_trips_and_row_blocks_restore_onto_any_placement(tmp_path):
    values = every_dtype()
    specs = [VariableSpec(name, (5, 2), name.split("/")[1]) for name in values]
    saved_on = place(specs, 2, max_shard_bytes=8)  # every variable cut into row blocks
    for shard in range(2):
        write_shard(str(tmp_path), 4, shard, {p.key: (p, values[p.variable][p.row_start:p.row_end],
                                                      {"m": values[p.variable][p.row_start:p.row_end]})
                                              for p in saved_on.for_shard(shard)})
    ckpt = Checkpoint(commit(str(tmp_path), 4, 2, {}))
    for name, value in values.items():
        got, slots = ckpt.read_rows(name, 1, 4)
        assert got.dtype == value.dtype and got.flags.writeable
        np.testing.assert_array_equal(got, value[1:4])
        np.testing.assert_array_equal(slots["m"], value[1:4])
    header = safetensors_file.decode(open(tmp_path / "ckpt-4" / "shard-0.safetensors", "rb").read(), "x")[1]
    assert any(name.startswith("v/bfloat16/rows_") for name in header)


@pytest.mark.torch
def test_bfloat16_is_bf16_for_pytorch(tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (make test-torch)")
    from safetensors.torch import load_file as torch_load_file
    value = np.arange(6, dtype=np.float32).reshape(3, 2).astype(ml_dtypes.bfloat16)
    path = save_params(str(tmp_path), 2, {"w": value}, CONFIG)
    loaded = torch_load_file(os.path.join(path, "shard-0.safetensors"))["w"]
    assert loaded.dtype == torch.bfloat16
    np.testing.assert_array_equal(loaded.float().numpy(), value.astype(np.float32))


def test_a_damaged_header_is_data_loss_naming_the_file(tmp_path):
    path = save_params(str(tmp_path), 1, {"w": np.ones((4, 3), np.float32)}, CONFIG)
    file = os.path.join(path, "shard-0.safetensors")
    data = open(file, "rb").read()
    for damaged in (data[:5], data[:8] + b"{not json" + data[17:], (10 ** 9).to_bytes(8, "little") + data[8:]):
        with pytest.raises(DataLossError, match="shard-0.safetensors"):
            safetensors_file.decode(damaged, file)
    with open(file, "wb") as f:
        f.write(data[:-3])  # truncated on disk: the manifest's size and crc32 catch it first
    with pytest.raises(DataLossError, match="shard-0.safetensors.*truncated or corrupt"):
        Checkpoint(path).read("w")


def write_first_format(ckpt_dir, step, values, slots, config):
    """A checkpoint as the first format wrote it: per piece one file of .npy records (value, then slots), a
    manifest listing each with its crc32; emb saved in two row blocks on two shards."""
    path = os.path.join(ckpt_dir, f"ckpt-{step}")
    os.makedirs(path)
    pieces = []
    blocks = {"emb": [(0, 3, 0), (3, 5, 1)], "dense/kernel": [(0, 2, 1)], "scale": [(0, 1, 0)]}
    for variable, rows in blocks.items():
        for start, stop, shard in rows:
            cut = slice(start, stop) if values[variable].ndim else ()
            file = f"{variable.replace('/', '%2F')}.rows-{start}-{stop}.npy"
            with open(os.path.join(path, file), "wb") as f:
                for array in (values[variable][cut], slots[variable][cut]):
                    np.save(f, np.asarray(array), allow_pickle=False)
            data = open(os.path.join(path, file), "rb").read()
            pieces.append({"key": variable if len(rows) == 1 else f"{variable}/part_{len(pieces)}", "variable": variable,
                           "row_start": start, "row_end": stop, "shape": list(np.shape(values[variable][cut])),
                           "dtype": str(values[variable].dtype), "slots": ["momentum"], "file": file,
                           "crc32": zlib.crc32(data), "bytes": len(data), "shard": shard})
    variables = {v: {"shape": list(values[v].shape), "dtype": str(values[v].dtype), "slots": ["momentum"]}
                 for v in values}
    manifest = {"format": "zmqflow-checkpoint-1", "step": step, "num_shards": 2, "config": config,
                "variables": variables, "pieces": pieces}
    with open(os.path.join(path, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    with open(os.path.join(ckpt_dir, "latest"), "w") as f:
        f.write(f"ckpt-{step}\n")
    return path


def first_format_state():
    rng = np.random.default_rng(7)
    values = {"emb": rng.standard_normal((5, 3)), "dense/kernel": rng.standard_normal((2, 4)), "scale": np.full((), 1.5)}
    values = {k: v.astype(np.float32) for k, v in values.items()}
    return values, {k: v * 2 for k, v in values.items()}


def test_a_first_format_checkpoint_restores_by_rows(tmp_path):
    values, slots = first_format_state()
    path = write_first_format(str(tmp_path), 9, values, slots, CONFIG)
    ckpt = Checkpoint(latest_checkpoint(str(tmp_path)))
    assert ckpt.format == checkpoint_npy.FORMAT and ckpt.step == 9 and ckpt.path == path
    for name, value in values.items():
        got, got_slots = ckpt.read(name)
        np.testing.assert_array_equal(got, value)
        np.testing.assert_array_equal(got_slots["momentum"], slots[name])
    np.testing.assert_array_equal(ckpt.read_rows("emb", 2, 4)[0], values["emb"][2:4])  # across both files


@pytest.mark.parametrize("out", [None, "converted"])
def test_convert_writes_safetensors_that_restore_the_same(tmp_path, out):
    values, slots = first_format_state()
    write_first_format(str(tmp_path / "old"), 9, values, slots, CONFIG)
    args = ["checkpoint", "convert", str(tmp_path / "old")] + (["--out", str(tmp_path / out)] if out else [])
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    new_dir = str(tmp_path / (out or "old"))
    assert result.output.strip() == f"{tmp_path / 'old' / 'ckpt-9'} -> {os.path.join(new_dir, 'ckpt-9')}"
    assert sorted(os.listdir(new_dir)) == ["ckpt-9", "latest"]
    ckpt = Checkpoint(latest_checkpoint(new_dir))
    assert ckpt.format == "zmqflow-checkpoint-2" and ckpt.step == 9 and ckpt.config == CONFIG
    assert sorted(os.listdir(ckpt.path)) == ["manifest.json", "shard-0.safetensors", "shard-1.safetensors"]
    loaded = {**load_file(os.path.join(ckpt.path, "shard-0.safetensors")),
              **load_file(os.path.join(ckpt.path, "shard-1.safetensors"))}
    np.testing.assert_array_equal(loaded["dense/kernel"], values["dense/kernel"])
    np.testing.assert_array_equal(loaded["scale/slot/momentum"], slots["scale"])
    np.testing.assert_array_equal(loaded["emb/rows_3_5"], values["emb"][3:])
    for name, value in values.items():
        np.testing.assert_array_equal(ckpt.read(name)[0], value)
        np.testing.assert_array_equal(ckpt.read(name)[1]["momentum"], slots[name])
    again = CliRunner().invoke(main, ["checkpoint", "convert", new_dir])
    assert again.exit_code == 0 and again.output.strip().endswith("already safetensors"), again.output


def test_inspect_lists_variables_step_and_model_as_a_table_and_json(tmp_path):
    values, slots = first_format_state()
    save_params(str(tmp_path), 3, {"dense/kernel": values["dense/kernel"], "scale": values["scale"]}, CONFIG)
    table = CliRunner().invoke(main, ["checkpoint", "inspect", str(tmp_path)])
    assert table.exit_code == 0, table.output
    print(table.output)
    lines = table.output.splitlines()
    assert "step 3" in lines[0] and "zmqflow-checkpoint-2" in lines[0] and lines[0].startswith(str(tmp_path / "ckpt-3"))
    assert json.loads(lines[1].split(":", 1)[1]) == MNIST_MLP and lines[2].split() == ["data:", "mnist"]
    assert lines[4].split() == ["variable", "shape", "dtype", "slots", "files"]
    assert lines[5].split() == ["dense/kernel", "[2,", "4]", "float32", "-", "shard-0.safetensors"]
    assert lines[6].split() == ["scale", "[]", "float32", "-", "shard-0.safetensors"]
    described = json.loads(CliRunner().invoke(main, ["checkpoint", "inspect", str(tmp_path / "ckpt-3"),
                                                     "--json"]).output)
    assert described["step"] == 3 and described["model"] == MNIST_MLP and described["data"] == "mnist"
    assert described["variables"][0] == {"name": "dense/kernel", "shape": [2, 4], "dtype": "float32", "slots": [],
                                         "files": ["shard-0.safetensors"], "tensors": ["dense/kernel"]}
    missing = CliRunner().invoke(main, ["checkpoint", "inspect", str(tmp_path.parent)])
    assert missing.exit_code == 1 and "NotFoundError" in missing.output and "holds none" in missing.output
