"""Options that the ps and worker commands share: model, placement, cluster from TF_CONFIG."""

import json

import click

from zmqflow.common.cluster.spec import ClusterSpec
from zmqflow.common.errors import InvalidArgumentError


def model_options(fn):
    for option in reversed([
        click.option("--model", "model_spec", default=None,
                     help="A built-in model (mlp, cnn, logistic, linear), a function in your file "
                          "(path/model.py:build), a spec file (.json/.yaml) or inline JSON. Default: the MNIST "
                          "MLP 784-100-10 (a model server: the model its checkpoint records)."),
        click.option("--placement", "placement_strategy", default="round_robin",
                     type=click.Choice(["round_robin", "greedy"]), help="How variables are spread over ps tasks."),
        click.option("--max-shard-bytes", default=None, type=int,
                     help="Split variables larger than this into row blocks across shards."),
    ]):
        fn = option(fn)
    return fn


trust_checkpoint_code_option = click.option(
    "--trust-checkpoint-code", is_flag=True,
    help="Build the model the checkpoint records even when it is code (module:Class, path/model.py:build) rather "
         "than a built-in model: only for checkpoints you trust (docs/security.md). A model file runs "
         "only while its sha256 is the one recorded at save time.")
"""The one --trust-checkpoint-code: every command that builds a checkpoint's model takes it (models/saved.py)."""


def parse_json_option(text, what):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{what} is not valid JSON: {exc}") from None


def task_from_tf_config(expected_types):
    """(cluster, type, index) from TF_CONFIG when it is set and names one of `expected_types`."""
    task = ClusterSpec.from_tf_config()
    if task is None or task.task_type is None:
        return None
    if task.task_type not in expected_types:
        raise InvalidArgumentError(f"TF_CONFIG task type {task.task_type!r} is not one of {expected_types}")
    task.cluster.validate()
    return task
