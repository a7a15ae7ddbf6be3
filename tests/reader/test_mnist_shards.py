"""`zmqflow data mnist-shards` + `zmqflow reader --preset mnist-shards`: exactly the training split, no test row."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from zmqflow.common.clients import queues
from zmqflow.inputs.datasets import mnist_split
from zmqflow.cli.main import main
from tests.reader.test_reader_cli import drain

pytestmark = pytest.mark.service


def rows(images, labels):
    """Each instance as bytes (label + pixels as uint8), sorted: a multiset to compare."""
    pixels = np.rint(np.asarray(images) * 255).astype(np.uint8)
    return sorted(bytes([int(label)]) + p.tobytes() for label, p in zip(labels, pixels))


def test_the_reader_gets_exactly_the_training_split(broker, processes, tmp_path):
    out = CliRunner().invoke(main, ["data", "mnist-shards", "--out", str(tmp_path / "mnist")])
    assert out.exit_code == 0, out.output
    assert "wrote 8 shards of the MNIST training split (4,500 rows" in out.output and "500 test rows left out" in out.output
    proc = processes.process("zmqflow.services.reader", [
        "--broker", broker, "--preset", "mnist-shards", "--files", str(tmp_path / "mnist" / "*.bin"),
        "--queue", "shards", "--queue-kind", "fifo", "--num-epochs", "1", "--progress-every-secs", "0",
        "--json-out", str(tmp_path / "stats.json")])
    got = drain(queues.attach("shards", broker=broker, timeout=30))
    assert proc.proc.wait(30) == 0, proc.log()
    assert got["label"].dtype == np.int32 and got["image"].dtype == np.float32 and got["image"].max() <= 1.0
    (train_x, train_y), (test_x, test_y) = mnist_split()
    assert rows(got["image"], got["label"]) == rows(train_x, train_y)
    assert not set(rows(got["image"], got["label"])) & set(rows(test_x, test_y))
    assert json.loads((tmp_path / "stats.json").read_text())["instances"] == 4500


@pytest.mark.unit
def test_rerun_rewrites_in_place_and_drops_stale_shards(tmp_path):
    runner, out = CliRunner(), tmp_path / "mnist"
    assert runner.invoke(main, ["data", "mnist-shards", "--out", str(out)]).exit_code == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    again = runner.invoke(main, ["data", "mnist-shards", "--out", str(out)])
    assert again.exit_code == 0 and {p.name: p.read_bytes() for p in out.iterdir()} == first   # same seed, same bytes
    three = runner.invoke(main, ["data", "mnist-shards", "--out", str(out), "--shards", "3", "--seed", "1"])
    assert three.exit_code == 0, three.output
    assert sorted(p.name for p in out.iterdir()) == [f"train-0{i}-of-03.bin" for i in range(3)]
    assert sum(p.stat().st_size for p in out.iterdir()) == 4500 * 785


@pytest.mark.unit
def test_clear_errors():
    runner = CliRunner()
    missing = runner.invoke(main, ["reader", "--broker", "tcp://127.0.0.1:1", "--preset", "mnist-shards"])
    assert missing.exit_code == 2 and "--preset mnist-shards has no default files" in missing.output
    assert "zmqflow data mnist-shards" in missing.output
    bad = runner.invoke(main, ["data", "mnist-shards", "--out", "x", "--shards", "0"])
    assert bad.exit_code == 2 and "--shards" in bad.output
    assert runner.invoke(main, ["data", "mnist-shards"]).exit_code == 2           # --out is required
    blocked = runner.invoke(main, ["data", "mnist-shards", "--out", "/proc/no/such/dir"])
    assert blocked.exit_code == 1 and "cannot write the shards" in blocked.output
