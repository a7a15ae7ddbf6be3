"""Elastic sync's options where users give them: the ps command, `zmqflow train` and the job spec."""

import json

import pytest
from click.testing import CliRunner

from zmqflow.cli.main import main
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.jobs.spec import Placement, job_spec, tasks
from zmqflow.models.spec import MNIST_MLP
from zmqflow.services.ps.cli import command as ps_command

pytestmark = pytest.mark.unit


def test_min_and_max_replicas_without_elastic_are_a_usage_error():
    result = CliRunner().invoke(ps_command, ["--model", json.dumps(MNIST_MLP), "--mode", "sync",
                                             "--replicas-to-aggregate", "2", "--min-replicas", "2"])
    assert result.exit_code == 2 and "--min-replicas and --max-replicas apply to an elastic sync job: add --elastic" \
        in result.output


def test_train_elastic_needs_sync_mode():
    result = CliRunner().invoke(main, ["train", "--elastic"])
    assert result.exit_code == 2 and "elastic applies to sync training: add --mode sync" in result.output


def test_an_elastic_job_runs_its_ps_with_elastic_and_no_fixed_replica_count():
    spec = job_spec(mode="sync", elastic=True, num_workers=3)
    ps = next(t for t in tasks(spec, Placement("tcp://127.0.0.1:5555")) if t.role == "ps")
    argv = ps.argv()
    assert "--elastic" in argv and "--replicas-to-aggregate" not in argv and "--total-num-replicas" not in argv
    fixed = next(t for t in tasks(job_spec(mode="sync"), Placement("tcp://127.0.0.1:5555")) if t.role == "ps")
    assert "--elastic" not in fixed.argv() and "elastic" not in fixed.config()
    with pytest.raises(InvalidArgumentError, match="elastic applies to sync mode"):
        job_spec(elastic=True)
    with pytest.raises(InvalidArgumentError, match="no replicas_to_aggregate, no spare_replicas"):
        job_spec(mode="sync", elastic=True, spare_replicas=1)
