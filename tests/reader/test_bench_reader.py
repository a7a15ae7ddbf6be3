"""`zmqflow bench reader --json`: it runs, measures the MNIST and the tabular data-spec phases, and reports
the ratios (their sizes, not their thresholds: timings belong to the benchmark, not to tests)."""

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_bench_reader_reports_mnist_and_tabular_rates_and_ratios():
    done = subprocess.run([sys.executable, "-m", "zmqflow", "bench", "reader", "--json", "--epochs", "1", "--repeats",
                           "1", "--rows", "2000", "--tabular-epochs", "1", "--train-epochs", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("csv_instances_per_s_1r", "csv_instances_per_s_2r", "tfrecord_instances_per_s_1r",
                "parse_only_instances_per_s"):
        assert result[key] > 0, key
    tabular = result["tabular"]
    assert tabular["rows"] == 2000 and tabular["numeric_columns"] == 40 and tabular["categories"] == 20
    for key in ("parse_only_instances_per_s", "broker_instances_per_s_1r", "train_examples_per_s",
                "train_examples_per_s_readers"):
        assert tabular[key] > 0, key
    assert tabular["broker_vs_parse"] == pytest.approx(
        tabular["broker_instances_per_s_1r"] / tabular["parse_only_instances_per_s"], rel=0.01)
    assert tabular["train_feed"] == "thread"       # 2,000 prepared rows are fed from memory
