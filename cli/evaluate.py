"""`zmqflow evaluate`: score a checkpoint's model on a split of a data spec (default: the shipped MNIST sample)."""

import json

import click

from zmqflow.common.processes.task_options import trust_checkpoint_code_option
from zmqflow.models.kernels import DEFAULT_BACKEND


@click.command(name="evaluate", context_settings={"show_default": True})
@click.option("--checkpoint", "checkpoint_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="Evaluate the latest checkpoint in this directory.")
@click.option("--model", "model_spec", default=None, metavar="MODEL",
              help="The model to read it into. Default: the model the checkpoint records.")
@click.option("--model-opt", "model_opts", multiple=True, metavar="KEY=VALUE",
              help="A model option (repeatable), with --model.")
@trust_checkpoint_code_option
@click.option("--data", "data_spec", default=None, metavar="SPEC",
              help="A data spec (YAML) or `mnist`, the shipped sample; its statistics are fitted on its train split, "
                   "as training did. Default: the spec the checkpoint records (trained with --data), else mnist.")
@click.option("--split", default="test", type=click.Choice(["test", "validation", "train"]),
              help="Which split of the data.")
@click.option("--backend", default=DEFAULT_BACKEND, type=click.Choice(["numpy", "numba"]), help="Kernels of the model.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def command(checkpoint_dir, model_spec, model_opts, trust_checkpoint_code, data_spec, split, backend, as_json):
    """Load the checkpoint into its model and report accuracy and log-loss (classifiers) or RMSE, MAE
    and R² (one output) on a split. Exit 1 when the checkpoint cannot be read into the model."""
    from zmqflow.jobs.evaluate import evaluate_checkpoint, labelled_split
    from zmqflow.models.spec import resolve_model, with_options
    if model_opts and not model_spec:
        raise click.UsageError("--model-opt needs --model")
    spec = with_options(resolve_model(model_spec), model_opts) if model_spec else None
    data, prepared = labelled_split(data_spec, split, checkpoint_dir)
    result = evaluate_checkpoint(checkpoint_dir, prepared.x, prepared.y, model_spec=spec, backend=backend,
                                 task=data.label.task, trust_checkpoint_code=trust_checkpoint_code)
    if as_json:
        click.echo(json.dumps(result))
        return
    shown = ", ".join(f"{name} {value:.4f}" for name, value in result["metrics"].items())
    click.echo(f"{shown} on {result['examples']:,} {split} examples (checkpoint step {result['step']}, "
               f"model {result['model']['type']})")
