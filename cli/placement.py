"""`zmqflow placement`: print the placement every task computes for a model, without starting anything."""

import json

import click

from zmqflow.common.processes.service_cli import option

from zmqflow.models.spec import MNIST_MLP, read_spec
from zmqflow.models.registry import model_variables
from zmqflow.common.cluster.placement import STRATEGIES, place


@click.command()
@click.option("--model", "model_spec", default=None,
              help="Model spec: a .json/.yaml file or inline JSON. Default: the MNIST MLP 784-100-10.")
@click.option("--num-ps", required=True, type=int, help="Number of ps tasks.")
@option("--placement", "strategy", old_names=["--strategy"], default="round_robin", show_default=True,
        type=click.Choice(STRATEGIES), help="How pieces are spread over the ps tasks.")
@click.option("--max-shard-bytes", default=None, type=int,
              help="Split variables larger than this into row blocks across shards.")
@click.option("--json", "as_json", is_flag=True, help="Print the pieces and shard loads as JSON.")
def placement(model_spec, num_ps, strategy, max_shard_bytes, as_json):
    """Print which ps task holds which variable (or rows of one) for a model."""
    spec = MNIST_MLP if model_spec is None else read_spec(model_spec)
    result = place(model_variables(spec), num_ps, strategy, max_shard_bytes)
    if as_json:
        click.echo(json.dumps({"num_ps": num_ps, "strategy": strategy, "max_shard_bytes": max_shard_bytes,
                               "pieces": result.as_rows(), "shard_bytes": result.shard_bytes()}))
    else:
        click.echo(result.table())
