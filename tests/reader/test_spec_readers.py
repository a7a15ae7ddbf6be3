"""`zmqflow reader --data-config`: reader processes stream a data spec's split as prepared rows through
the broker: every row num_epochs times, the queue closed once both readers are done, bad rows named."""

import collections
import json
import time

import numpy as np
import pytest

from zmqflow.common.clients import queues
from zmqflow.common.errors import OutOfRangeError
from zmqflow.inputs.data_spec import fit, load_spec, load_tables, model_inputs, labels, to_config
from zmqflow.jobs.local_cluster import start_readers
from tests.inputs.test_spec_stream import spec_dict, write_parts
from tests.reader.test_reader_processes import wait_for_state

pytestmark = pytest.mark.service


def config_file(directory, **extra):
    """The spec fitted on its train split, written as the launcher writes it; (path, spec, tables)."""
    spec = load_spec(spec_dict(directory, **extra))
    tables = load_tables(spec)
    fit(spec, tables["train"])
    path = directory / "data-config.json"
    path.write_text(json.dumps(to_config(spec)))
    return str(path), spec, tables


def spec_readers(broker, processes, count, data_config, queue, **options):
    options = {"data_config": data_config, "queue": queue, "progress_every": 0, "heartbeat_timeout_secs": 2.0,
               "chunk_size": 16, **options}
    return [processes.adopt(p) for p in start_readers(broker, processes=count, log_dir=processes.log_dir,
                                                      stats_dir=processes.log_dir, **options)]


def drain(queue, limit_s=30):
    batches, deadline = [], time.monotonic() + limit_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            batches.append(queue.dequeue_up_to(50, timeout=min(10, left)))
        except OutOfRangeError:
            return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    raise AssertionError(f"the queue did not close within {limit_s} s")


def rows_of(x, y):
    return collections.Counter(row.tobytes() + bytes([label]) for row, label in zip(x, y))


def test_two_readers_deliver_every_prepared_row_of_the_split_each_epoch(broker, processes, tmp_path):
    write_parts(tmp_path, parts=4, rows=30)
    data_config, spec, tables = config_file(tmp_path, split={"validation": 0.2, "seed": 1})
    procs = spec_readers(broker, processes, 2, data_config, "spec-2r", num_epochs=3, queue_kind="shuffle",
                         capacity=40, min_after_dequeue=8, seed=5)
    queue = queues.attach("spec-2r", broker=broker, timeout=30)
    wait_for_state(broker, "spec-2r", lambda s: len(s["producers"]) == 2)   # the small queue holds the first back
    got = drain(queue)
    assert [p.proc.wait(30) for p in procs] == [0, 0], [p.log()[-2000:] for p in procs]
    assert queue.is_closed()
    assert got["input"].dtype == np.float32 and got["label"].dtype == np.int32 and got["input"].shape[1] == 6
    train = tables["train"]
    expected = rows_of(model_inputs(spec, train), labels(spec, train))
    assert len(expected) == len(train) == 96          # 120 rows, 24 drawn for validation; each row distinct
    assert rows_of(got["input"], got["label"]) == {key: 3 for key in expected}
    summaries = [json.loads((tmp_path / f"reader-{i}.json").read_text()) for i in range(2)]
    assert {s["outcome"] for s in summaries} == {"ok"} and sum(s["files_done"] for s in summaries) == 12
    assert all(s["instances"] for s in summaries)   # both read
    assert sum(s["instances"] for s in summaries) == 3 * 96


def test_a_bad_row_fails_the_pipeline_naming_file_line_and_column(broker, processes, tmp_path):
    write_parts(tmp_path, parts=2, rows=30)
    data_config, _, _ = config_file(tmp_path)
    write_parts(tmp_path, parts=2, rows=30, bad=(1, 5, "34,big,rome,k1"))
    procs = spec_readers(broker, processes, 1, data_config, "spec-bad", num_epochs=1, queue_kind="fifo",
                         shuffle_files=False)
    queue = queues.attach("spec-bad", broker=broker, timeout=30)
    assert procs[0].proc.wait(30) == 2, procs[0].log()[-2000:]     # 2: bad input, a bad row met mid-run (V6)
    summary = json.loads((tmp_path / "reader-0.json").read_text())
    assert summary["outcome"] == "failed"
    assert "part-1.csv:6: malformed CSV line: column 2 (size): cannot parse 'big'" in summary["error"]
    assert queue.is_closed()


def test_skip_bad_rows_skips_and_counts_them(broker, processes, tmp_path):
    write_parts(tmp_path, parts=2, rows=30)
    data_config, spec, tables = config_file(tmp_path, skip_bad_rows=True)
    write_parts(tmp_path, parts=2, rows=30, bad=(1, 5, "34,big,rome,k1"))
    procs = spec_readers(broker, processes, 1, data_config, "spec-skip", num_epochs=2, queue_kind="fifo")
    got = drain(queues.attach("spec-skip", broker=broker, timeout=30))
    assert procs[0].proc.wait(30) == 0, procs[0].log()[-2000:]
    summary = json.loads((tmp_path / "reader-0.json").read_text())
    assert summary["outcome"] == "ok" and summary["malformed_skipped"] == 2 and len(got["label"]) == 2 * 59


def test_data_config_refuses_the_options_it_replaces(tmp_path):
    from click.testing import CliRunner
    from zmqflow.services.reader.cli import command
    write_parts(tmp_path, parts=1)
    data_config, _, _ = config_file(tmp_path)
    done = CliRunner().invoke(command, ["--broker", "tcp://127.0.0.1:1", "--data-config", data_config,
                                        "--preset", "mnist-csv"])
    assert done.exit_code == 2 and "--data-config gives the files, format and features" in done.output
