"""`zmqflow train --at-least-once`: the workers and the reader of a local job take their input with leases."""

import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.jobs.local_cluster import LocalCluster, run_training

pytestmark = pytest.mark.integration


def test_a_job_with_at_least_once_input_acks_every_row_it_trained_on():
    summary = run_training(progress=False, seed=0, epochs=2, at_least_once=True)
    print(f"\nat-least-once job: {summary['input_acked']} rows acked of {summary['examples']} trained, "
          f"{summary['examples_per_s']} examples/s, accuracy {summary['test_accuracy']}")
    assert summary["worker_exit_codes"] == [0, 0]
    assert summary["input_acked"] == summary["examples"] == 2 * 4500


@pytest.mark.unit
def test_at_least_once_with_data_preloaded_on_the_ps_is_refused():
    with pytest.raises(InvalidArgumentError, match="input 'ps' is sliced by row on ps 0"):
        LocalCluster(input="ps", at_least_once=True)
