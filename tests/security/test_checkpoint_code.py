"""A checkpoint is data: a crafted manifest runs no code and reads no file outside its folder.

The attack of issue 23: a manifest whose model is `subprocess:getoutput`, with the shell command as the
spec's first key (Popen runs `sh -c <first key>` when handed the spec dict), ran that command under
`zmqflow evaluate`. Since issue 24 a function is called as build(input_signature, **options), so the
crafted manifest here names `subprocess:call` and puts `sh`, `-c` and the command in its input signature
(Popen runs the signature's names). Here each command that builds a checkpoint's model (evaluate, predict, export,
serve, the Python API) is handed such a checkpoint for real and must refuse it, naming the reference and
the two ways to allow it, and the command's marker file must not appear. The same checkpoint with
--trust-checkpoint-code does run the command (the detector works). A model file runs when trusted or
named with --model, never once its sha256 differs from the one recorded at save time. Manifest file
names stay inside the checkpoint folder; a deeply nested safetensors header is a corrupt file.
"""

import json
import os
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

from zmqflow.common.checkpoints import safetensors_file
from zmqflow.common.checkpoints.checkpoint import Checkpoint, save_params
from zmqflow.common.errors import DataLossError, PermissionDeniedError
from zmqflow.jobs.evaluate import evaluate_checkpoint
from zmqflow.jobs.export import export_checkpoint
from zmqflow.jobs.predict import predict_file
from zmqflow.models.registry import load_model
from zmqflow.models.saved import LoadedCheckpoint, with_model_sha256

pytestmark = pytest.mark.service   # real commands and a real model server; the file checks below are unit tests

LOGISTIC = {"type": "logistic", "inputs": 784, "classes": 10}
REFUSED = "PermissionDeniedError: checkpoint"
MODEL_FILE = '''
import os
from zmqflow.models.builtin import build as builtin

open(os.environ["ZMQFLOW_TEST_MARKER"], "a").close()   # the file ran: the test sees it


def build(input_signature, classes=5):
    return builtin({"type": "logistic", "inputs": 784, "classes": classes})
'''


def _zmqflow(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "zmqflow", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture
def crafted(tmp_path):
    """A checkpoint whose model is `subprocess:call`, `sh -c "touch <marker>"` the names of its input signature."""
    marker = tmp_path / "pwned"
    model = {"type": "subprocess:call",
             "input_signature": {name: [[1], "float32"] for name in ("sh", "-c", f"touch {marker}")}}
    save_params(str(tmp_path / "ckpt"), 1, load_model(LOGISTIC).initial_values(0), {"model": model})
    return tmp_path / "ckpt", marker


def _assert_refused(output, marker):
    assert REFUSED in output and "'subprocess:call'" in output, output
    assert "--model subprocess:call" in output and "--trust-checkpoint-code" in output, output
    assert not marker.exists(), "the checkpoint's command ran"


def test_evaluate_refuses_the_code_a_checkpoint_names(crafted):
    ckpt, marker = crafted
    result = _zmqflow("evaluate", "--checkpoint", ckpt)
    assert result.returncode == 1
    _assert_refused(result.stderr, marker)


def test_predict_refuses_it(crafted, tmp_path):
    ckpt, marker = crafted
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b\n1,2\n")
    result = _zmqflow("predict", "--checkpoint", ckpt, "--input", rows)
    assert result.returncode == 1
    _assert_refused(result.stderr, marker)


def test_export_refuses_it(crafted, tmp_path):
    ckpt, marker = crafted
    result = _zmqflow("export", "--checkpoint", ckpt, tmp_path / "m.onnx")
    assert result.returncode == 1 and not (tmp_path / "m.onnx").exists()
    _assert_refused(result.stderr, marker)


def test_a_model_server_exits_with_the_refusal(crafted, tmp_path):
    """The real `zmqflow serve` process (what compose and Kubernetes run) exits 1 before it serves."""
    ckpt, marker = crafted
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "zmqflow", "serve", "--checkpoint", str(ckpt), "--bind",
                             "tcp://127.0.0.1:*", "--backend", "numpy", "--ready-file", str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1 and not ready.exists()
    _assert_refused(err, marker)


@pytest.mark.unit
def test_the_python_api_refuses_it(crafted, tmp_path):
    ckpt, marker = crafted
    x, y = np.zeros((2, 784), np.float32), np.zeros(2, np.int64)
    for call in (lambda: LoadedCheckpoint.open(ckpt), lambda: evaluate_checkpoint(ckpt, x, y),
                 lambda: predict_file(ckpt, str(tmp_path / "none.csv")),
                 lambda: export_checkpoint(ckpt, str(tmp_path / "m.onnx"))):
        with pytest.raises(PermissionDeniedError, match="trust_checkpoint_code=True"):
            call()
    assert not marker.exists()


def test_trusted_the_checkpoint_code_runs(crafted):
    """The detector works: with --trust-checkpoint-code the very same checkpoint runs its command (and then
    fails, call's exit code being no model): what the refusals above keep from happening."""
    ckpt, marker = crafted
    result = _zmqflow("evaluate", "--checkpoint", ckpt, "--trust-checkpoint-code")
    assert result.returncode == 2 and "subprocess:call returned int, which lacks the model protocol" in \
        result.stderr, result.stderr
    assert marker.exists()


@pytest.fixture
def model_file_checkpoint(tmp_path):
    """A checkpoint of a model in a file with an option (classes=10), saved as the chief saves one (its config
    with the file's sha256)."""
    path = tmp_path / "my_model.py"
    path.write_text(MODEL_FILE)
    spec = {"type": f"{path}:build", "classes": 10}
    params = load_model(LOGISTIC).initial_values(1)
    marker = tmp_path / "imported"
    save_params(str(tmp_path / "ckpt"), 3, params, with_model_sha256({"model": spec}))
    return tmp_path / "ckpt", path, marker, {"ZMQFLOW_TEST_MARKER": str(marker)}


def test_a_model_file_runs_only_when_trusted_or_named(model_file_checkpoint):
    """Named by --model (just the reference), the recorded spec is built, its options too (classes=10, where the
    file's default is 5)."""
    ckpt, path, marker, env = model_file_checkpoint
    assert json.loads((ckpt / "ckpt-3" / "manifest.json").read_text())["config"]["model_sha256"]
    refused = _zmqflow("evaluate", "--checkpoint", ckpt, env=env)
    assert refused.returncode == 1 and REFUSED in refused.stderr and f"--model {path}:build" in refused.stderr
    assert not marker.exists()
    for allow in (["--trust-checkpoint-code"], ["--model", f"{path}:build"]):
        result = _zmqflow("evaluate", "--checkpoint", ckpt, "--json", *allow, env=env)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["step"] == 3 and marker.exists()
        marker.unlink()


def test_a_changed_model_file_is_refused_even_trusted(model_file_checkpoint):
    ckpt, path, marker, env = model_file_checkpoint
    recorded = json.loads((ckpt / "ckpt-3" / "manifest.json").read_text())["config"]["model_sha256"]
    path.write_text(MODEL_FILE + "\nprint('added after the checkpoint was saved')\n")
    result = _zmqflow("evaluate", "--checkpoint", ckpt, "--trust-checkpoint-code", env=env)
    assert result.returncode == 1 and "PermissionDeniedError: model file" in result.stderr, result.stderr
    assert recorded in result.stderr and _sha256(path) in result.stderr
    assert not marker.exists()
    named = _zmqflow("evaluate", "--checkpoint", ckpt, "--model", f"{path}:build", env=env)
    assert named.returncode == 0, named.stderr   # the operator names the file as it is now: theirs to run


def _sha256(path):
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_model_server_serves_a_trusted_model_file(model_file_checkpoint, processes):
    """--trust-checkpoint-code reaches the model server: `zmqflow serve` builds the file's model and answers."""
    from zmqflow.common.clients.serve import ModelClient
    ckpt, _, marker, env = model_file_checkpoint
    server = processes.service("zmqflow.services.serve", ["--checkpoint", str(ckpt), "--backend", "numpy",
                                                          "--trust-checkpoint-code"], env=env)
    client = ModelClient(server.endpoint, timeout=10)
    try:
        probabilities, _ = client.predict(np.zeros((2, 784), np.float32))
        info = client.model_info()
    finally:
        client.close()
    assert probabilities.shape == (2, 10) and marker.exists()
    # model_info is a client op: it names the model file and the checkpoint, not where they are on the host
    assert info["spec"]["type"] == "my_model.py:build" and info["source"] == "ckpt-3", info
    assert str(ckpt.parent) not in json.dumps(info, default=str), info


# --- files the manifest names -------------------------------------------------------------------

@pytest.fixture
def saved(tmp_path):
    """A one-shard checkpoint and, outside it, a valid copy of its tensor file (what a crafted name would reach)."""
    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    path = save_params(str(tmp_path / "ckpt"), 7, params, {})
    outside = tmp_path / "outside"
    outside.mkdir()
    data = open(os.path.join(path, "shard-0.safetensors"), "rb").read()
    (outside / "x.safetensors").write_bytes(data)
    assert np.array_equal(Checkpoint(path).read("w")[0], params["w"])   # it reads as saved
    return path, outside / "x.safetensors"


def _rename_file(path, name):
    """The checkpoint's manifest with its one tensor file renamed to `name`."""
    manifest_path = os.path.join(path, "manifest.json")
    manifest = json.load(open(manifest_path))
    manifest["files"] = {name: info for info in manifest["files"].values()}
    for piece in manifest["pieces"]:
        piece["file"] = name
    json.dump(manifest, open(manifest_path, "w"))


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_manifest_file_names_stay_inside_the_checkpoint(saved, kind):
    path, outside = saved
    if kind == "dotdot":
        name = os.path.relpath(outside, path)
        assert name.startswith("..")
    elif kind == "absolute":
        name = str(outside)
    else:
        name = "shard-0.safetensors"
        os.remove(os.path.join(path, name))
        os.symlink(outside, os.path.join(path, name))
    _rename_file(path, name)
    with pytest.raises(DataLossError, match="outside the checkpoint directory|a relative name inside its directory"):
        Checkpoint(path).read("w")


@pytest.mark.unit
def test_a_link_inside_the_checkpoint_still_reads(saved):
    path, _ = saved
    os.rename(os.path.join(path, "shard-0.safetensors"), os.path.join(path, "real.safetensors"))
    os.symlink("real.safetensors", os.path.join(path, "shard-0.safetensors"))
    assert Checkpoint(path).read("w")[0].shape == (2, 3)


@pytest.mark.unit
def test_first_format_file_names_stay_inside_too(tmp_path):
    """The first format's piece files (.npy records) are named by the manifest as well."""
    outside = tmp_path / "secret.npy"
    value = np.ones((2, 2), np.float32)
    with open(outside, "wb") as f:
        np.save(f, value, allow_pickle=False)
    data = outside.read_bytes()
    path = tmp_path / "ckpt" / "ckpt-1"
    path.mkdir(parents=True)
    for name in ("../../secret.npy", str(outside)):
        piece = {"key": "v", "variable": "v", "row_start": 0, "row_end": 2, "shape": [2, 2], "dtype": "float32",
                 "slots": [], "file": name, "crc32": zlib.crc32(data), "bytes": len(data), "shard": 0}
        (path / "manifest.json").write_text(json.dumps({
            "format": "zmqflow-checkpoint-1", "step": 1, "num_shards": 1, "config": {},
            "variables": {"v": {"shape": [2, 2], "dtype": "float32", "slots": []}}, "pieces": [piece]}))
        with pytest.raises(DataLossError, match="a relative name inside its directory"):
            Checkpoint(str(path)).read("v")


@pytest.mark.unit
def test_a_deeply_nested_safetensors_header_is_a_corrupt_file(tmp_path):
    header = b'{"a":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    data = len(header).to_bytes(8, "little") + header
    started = time.perf_counter()
    with pytest.raises(DataLossError, match="nested too deeply"):
        safetensors_file.decode(data, "crafted.safetensors")
    assert time.perf_counter() - started < 5
