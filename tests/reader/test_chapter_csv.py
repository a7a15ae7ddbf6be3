"""The chapter's my_test.csv (Hands-On ML ch. 12) read by a real reader process into a real broker, and by a data
spec: TensorFlow's answers, written literally (x1=[1, 4, 7], x2=[-1, 5, -1], target=[0, 1, 0])."""

import json
import pathlib

import numpy as np
import pytest

from zmqflow.common.clients import queues
from zmqflow.common.errors import OutOfRangeError
from zmqflow.jobs.local_cluster import start_readers

MY_TEST_CSV = str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "data" / "my_test.csv")
# TensorFlow: reader = tf.TextLineReader(skip_header_lines=1); tf.decode_csv(line, record_defaults=[[-1.], [-1.], [-1]])
CHAPTER = {"record_defaults": [[-1.], [-1.], [-1]], "skip_header_lines": 1, "columns": {"x1": 0, "x2": 1, "target": 2}}


def read_into_queue(broker, processes, tmp_path, queue, files, options):
    """One reader process, one epoch, file order kept, into a FIFO queue; (its process, the queue)."""
    proc, = [processes.adopt(p) for p in start_readers(
        broker, files=files, format_kind="csv", format_options=json.dumps(options), queue=queue, queue_kind="fifo",
        num_epochs=1, shuffle_files=False, progress_every=0, log_dir=processes.log_dir, stats_dir=str(tmp_path))]
    return proc, queues.attach(queue, broker=broker, timeout=30)


@pytest.mark.integration
def test_the_reader_service_reads_my_test_csv_as_tensorflow(broker, processes, tmp_path):
    proc, queue = read_into_queue(broker, processes, tmp_path, "chapter", [MY_TEST_CSV], CHAPTER)
    rows = queue.dequeue_up_to(10, timeout=20)
    with pytest.raises(OutOfRangeError):
        queue.dequeue_up_to(10, timeout=20)
    assert proc.proc.wait(30) == 0, proc.log()[-2000:]
    assert rows["x1"].tolist() == [1., 4., 7.]
    assert rows["x2"].tolist() == [-1., 5., -1.]
    assert rows["target"].tolist() == [0, 1, 0]
    assert rows["x2"].dtype == np.float32 and rows["target"].dtype == np.int32


@pytest.mark.integration
def test_a_field_of_spaces_with_no_default_fails_the_reader_naming_file_line_and_column(broker, processes, tmp_path):
    required = dict(CHAPTER, record_defaults=[[-1.], "float32", [-1]])   # TF: [] for x2, "required"
    proc, queue = read_into_queue(broker, processes, tmp_path, "chapter-required", [MY_TEST_CSV], required)
    assert proc.proc.wait(30) == 2, proc.log()[-2000:]     # bad input (V6)
    error = json.loads((tmp_path / "reader-0.json").read_text())["error"]
    assert f"{MY_TEST_CSV}:2: malformed CSV line: column 1 is empty and has no default" in error


@pytest.mark.unit
def test_a_data_spec_gives_an_empty_numeric_field_its_default():
    from zmqflow.inputs.data_spec import load_spec, load_tables
    spec = load_spec({"files": MY_TEST_CSV, "label": {"column": "target", "task": "binary"},
                      "features": {"x1": {"type": "numeric", "default": -1}, "x2": {"type": "numeric", "default": -1}}})
    table = load_tables(spec)["train"]
    assert table.columns["x1"].tolist() == [1., 4., 7.] and table.columns["x2"].tolist() == [-1., 5., -1.]
