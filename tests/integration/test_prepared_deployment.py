"""A deployment on your data, as docker-compose.yml runs it but as local processes: `zmqflow data
prepare` once, then a broker, a ps, a reader streaming the prepared shards and two workers, the chief
scoring the spec's test split; the checkpoint serves raw rows."""

import json
import subprocess
import sys

import pytest
import yaml

from zmqflow.common.clients.serve import ModelClient
from tests.support import wait_for
from tests.support.tabular import spec_dict, write_csv

pytestmark = pytest.mark.integration

ZMQFLOW = [sys.executable, "-m", "zmqflow"]


def test_prepared_shards_train_a_model_of_your_data_without_a_launcher(processes, tmp_path):
    write_csv(tmp_path / "pets.csv", 2000, seed=7)
    (tmp_path / "pets.yaml").write_text(yaml.safe_dump(spec_dict(
        tmp_path / "pets.csv", split={"validation": 0.1, "test": 0.2, "seed": 0})))
    prepared = tmp_path / "prepared"
    done = subprocess.run([*ZMQFLOW, "data", "prepare", "--data", str(tmp_path / "pets.yaml"), "--out", str(prepared)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "1,400 train rows of 28 bytes in 8 shards, model mlp" in done.stdout   # 6 inputs + the label, 4 bytes each
    config, model = str(prepared / "data-config.json"), str(prepared / "model.json")
    layers = json.loads((prepared / "model.json").read_text())["layers"]
    assert (layers[0], layers[-1]) == (6, 2)                     # fitted: 6 inputs, 2 classes

    broker = processes.service("zmqflow.services.broker")
    ps = processes.service("zmqflow.services.ps", ["--model", model, "--optimizer",   # it saves under ckpt/ only
                                                  '{"kind": "adam", "learning_rate": 0.01}', "--checkpoint-root",
                                                  str(tmp_path / "ckpt")])
    reader = processes.process("zmqflow.services.reader", ["--broker", broker.endpoint, "--data-config", config,
                                                           "--num-epochs", "15", "--capacity", "2000"])
    common = ["--broker", broker.endpoint, "--ps", ps.endpoint, "--num-workers", "2", "--model", model,
              "--data-config", config, "--backend", "numpy"]
    result = tmp_path / "chief.json"
    chief = processes.process("zmqflow.services.worker", [*common, "--task-index", "0", "--evaluate", "--shutdown-ps",
                                                          "--checkpoint-dir", str(tmp_path / "ckpt"),
                                                          "--json-out", str(result)])
    other = processes.process("zmqflow.services.worker", [*common, "--task-index", "1"])
    wait_for(lambda: not chief.alive() and not other.alive(), 120, "both workers to finish")
    assert chief.returncode == 0 and other.returncode == 0 and reader.returncode == 0, chief.log()[-3000:]
    summary = json.loads(result.read_text())
    assert summary["test_split"] == "test" and summary["test_metrics"]["accuracy"] > 0.85, summary
    assert summary["global_step"] == pytest.approx(15 * 1400 / 100, abs=2)   # every prepared row, 15 times
    served = processes.service("zmqflow.services.serve", ["--checkpoint", str(tmp_path / "ckpt"), "--backend",
                                                          "numpy"])
    with ModelClient(served.endpoint, timeout=10) as client:
        _, info = client.predict_records({"age": [70.0, 15.0], "size": [0.0, 0.0], "city": ["rome", "oslo"]})
    assert info["predicted"] == ["cat", "dog"]
