"""`python -m zmqflow.services.reader` against a real broker: presets of the shipped files, exit codes, SIGTERM."""

import json
import time

import numpy as np
import pytest
from click.testing import CliRunner

from zmqflow.common.clients import queues
from zmqflow.common.errors import (ABORTED, INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, CancelledError,
                                   OutOfRangeError)
from zmqflow.cli.main import main
from zmqflow.services.reader.cli import exit_code, resolve_input
from tests.deploy.test_compose_file import parse_zmqflow
from tests.reader import mnist_csv
from tests.support import wait_for

pytestmark = pytest.mark.service


def drain(queue, limit_s=60):
    out, deadline = [], time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            out.append(queue.dequeue_up_to(500, timeout=20))
        except OutOfRangeError:
            return {k: np.concatenate([b[k] for b in out]) for k in out[0]}
    raise AssertionError("the queue did not end in time")


def test_the_three_presets_give_the_same_rows_as_the_csv(broker, processes, tmp_path):
    pixels, labels = mnist_csv()
    runs = {"mnist-csv": 5000, "mnist-tfrecord": 100, "mnist-fixed": 100}
    procs = {preset: processes.process("zmqflow.services.reader", [
        "--broker", broker, "--preset", preset, "--queue", f"cli-{preset}", "--queue-kind", "fifo",
        "--no-shuffle-files", "--num-epochs", "1", "--json-out", str(tmp_path / f"{preset}.json"),
        "--progress-every-secs", "0"]) for preset in runs}
    for preset, rows in runs.items():
        got = drain(queues.attach(f"cli-{preset}", broker=broker, timeout=30))
        assert got["label"].dtype == np.int32 and got["image"].dtype == np.float32
        np.testing.assert_array_equal(got["label"], labels[:rows])
        np.testing.assert_allclose(got["image"], pixels[:rows] / 255, atol=1e-6)
    for preset, proc in procs.items():
        assert proc.proc.wait(30) == 0, proc.log()
        summary = json.loads((tmp_path / f"{preset}.json").read_text())
        assert summary["outcome"] == "ok" and summary["instances"] == runs[preset]
        assert "pipeline ok" in proc.log()


def test_sigterm_mid_file_exits_zero_and_the_consumer_gets_cancelled(broker, processes):
    proc = processes.process("zmqflow.services.reader", ["--broker", broker, "--preset", "mnist-csv",
                                                        "--queue", "cli-sigterm", "--queue-kind", "fifo",
                                                        "--capacity", "300", "--num-epochs", "0",
                                                        "--chunk-size", "100", "--heartbeat-timeout-secs", "2"])
    queue = queues.attach("cli-sigterm", broker=broker, timeout=30)
    wait_for(lambda: queue.size() >= 300, 30, "the reader blocked mid-file on a full queue")
    assert proc.stop(timeout=10) == 0, proc.log()
    assert "stopped (SIGTERM) while reading" in proc.log()
    assert queue.is_closed()
    with pytest.raises(CancelledError, match="SIGTERM"):
        queue.dequeue(timeout=5)


def test_a_pipeline_already_closed_is_left_alone(broker, processes):
    args = ["--broker", broker, "--preset", "mnist-fixed", "--queue", "cli-twice", "--queue-kind", "fifo",
            "--progress-every-secs", "0"]
    first = processes.process("zmqflow.services.reader", args)
    assert len(drain(queues.attach("cli-twice", broker=broker, timeout=30))["label"]) == 100
    assert first.proc.wait(30) == 0
    again = CliRunner().invoke(main, ["reader", *args])
    assert again.exit_code == 0, again.output
    state = queues.attach("cli-twice", broker=broker).producers()
    assert state["closed"] == "ok" and len(state["producers"]) == 1


@pytest.mark.unit
def test_usage_errors_and_help():
    runner = CliRunner()
    assert "--min-after-dequeue" in runner.invoke(main, ["reader", "--help"]).output
    bad = runner.invoke(main, ["reader", "--broker", "tcp://127.0.0.1:1", "--preset", "mnist-tfrecord",
                               "--skip-bad-rows"])
    assert bad.exit_code == 2 and "csv format only" in bad.output
    bad = runner.invoke(main, ["reader", "--broker", "tcp://127.0.0.1:1", "--format", "csv", "--format-options", "{"])
    assert bad.exit_code == 2 and "not valid JSON" in bad.output
    bad = runner.invoke(main, ["reader", "--broker", "tcp://127.0.0.1:1", "--files", "/nonexistent/*.csv",
                               "--preset", "mnist-csv"])
    assert bad.exit_code == 2 and "Error: NotFoundError: no file matches" in bad.output   # bad input (V6)


@pytest.mark.unit
def test_presets_resolve_and_arguments_round_trip(tmp_path):
    kind, options, files, features, cast = resolve_input("mnist-fixed", chunk_size=64)
    assert kind == "fixed_length" and options["chunk_size"] == 64 and cast == {"label": "int32"}
    assert features == ["image", "label"] and files[0].endswith("mnist_sample.bin")
    kind, options, _, _, _ = resolve_input("mnist-csv", format_kind="tfrecord", format_options={"features": None})
    assert kind == "tfrecord" and options == {"features": None}  # another format drops the preset's options
    config = tmp_path / "reader0.json"     # what start_readers writes: options by parameter or flag name
    config.write_text(json.dumps({"files": ["a*"], "preset": "mnist-csv", "num_epochs": 2, "shuffle_files": False,
                                  "skip_bad_rows": True, "cast": ["label=int32"], "queue": "q"}))
    assert parse_zmqflow(["zmqflow", "reader", "--config", str(config)]) == parse_zmqflow([
        "zmqflow", "reader", "--files", "a*", "--preset", "mnist-csv", "--num-epochs", "2", "--no-shuffle-files",
        "--skip-bad-rows", "--cast", "label=int32", "--queue", "q"])


@pytest.mark.unit
def test_tf_config_names_the_reader_and_gives_the_broker(monkeypatch):
    from zmqflow.services.reader.cli import _tf_config_task
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"broker": ["10.0.0.5:5555"], "reader": ["a:1", "b:1"]},
                                                "task": {"type": "reader", "index": 1}}))
    assert _tf_config_task() == ("reader:1", "tcp://10.0.0.5:5555")
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["w:1"]}, "task": {"type": "worker"}}))
    assert _tf_config_task() == ("reader", None)
    monkeypatch.delenv("TF_CONFIG")
    assert _tf_config_task() == ("reader", None)


def test_a_bad_row_found_while_reading_exits_2(broker, processes, tmp_path, mnist_lines):
    """V6 (docs/cli.md): bad input exits 2, also a bad row the reader meets mid-run; the summary names it."""
    lines = list(mnist_lines[:50])
    lines[7] = b"1,2,3\n"
    (tmp_path / "bad.csv").write_bytes(b"".join(lines))
    summary = tmp_path / "summary.json"
    reader = processes.process("zmqflow.services.reader", [
        "--broker", broker, "--preset", "mnist-csv", "--files", str(tmp_path / "bad.csv"), "--queue", "cli-bad-row",
        "--queue-kind", "fifo", "--progress-every-secs", "0", "--json-out", str(summary)])
    assert reader.proc.wait(60) == 2, reader.log()[-3000:]
    result = json.loads(summary.read_text())
    assert result["outcome"] == "failed" and result["code"] == INVALID_ARGUMENT and "bad.csv:8" in result["error"]


@pytest.mark.unit
def test_a_failed_readers_exit_code():
    """2 bad input (this reader's or another's bad row fails the pipeline INVALID_ARGUMENT), 3 the broker lost,
    1 any other failure."""
    assert exit_code({"outcome": "failed", "code": INVALID_ARGUMENT}) == 2
    assert exit_code({"outcome": "error", "code": NOT_FOUND, "bad_input": True}) == 2   # no such files
    assert exit_code({"outcome": "error", "code": UNAVAILABLE, "peer_lost": True}) == 3
    assert exit_code({"outcome": "failed", "code": ABORTED}) == 1
