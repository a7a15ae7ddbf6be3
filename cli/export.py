"""`zmqflow export`: write a checkpoint's model as an ONNX file (jobs/export.py)."""

import json

import click

from zmqflow.common.processes.service_cli import option

from zmqflow.common.errors import FailedPreconditionError, UnimplementedError
from zmqflow.common.processes.task_options import trust_checkpoint_code_option
from zmqflow.models.onnx_export import DEFAULT_OPSET, MIN_OPSET


class CannotExport(click.ClickException):
    """The model cannot be exported here (no onnx package, a layer or framework without a mapping): exit 2."""

    exit_code = 2


@click.command(name="export", context_settings={"show_default": True})
@click.option("--checkpoint", "checkpoint_dir", required=True, type=click.Path(file_okay=False, exists=True),
              help="A checkpoint directory (ckpt-<step>), or the directory whose `latest` checkpoint to export.")
@click.option("--format", "fmt", default="onnx", type=click.Choice(["onnx"]), help="The file format.")
@click.option("--opset", default=DEFAULT_OPSET, type=click.IntRange(min=MIN_OPSET),
              help="The ONNX opset to write, up to the installed onnx package's (a runtime runs the opsets it knows).")
@option("--model-name", "model_name", old_names=["--name"], default=None,
        help="The model name in the file's metadata (default: the checkpoint directory's, as a server names it).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as one JSON object.")
@trust_checkpoint_code_option
@click.argument("out", type=click.Path(dir_okay=False))
def command(checkpoint_dir, fmt, opset, model_name, as_json, trust_checkpoint_code, out):
    """Write the checkpoint's model to OUT (e.g. model.onnx) for onnxruntime or any ONNX runtime.

    The file computes what `zmqflow serve` answers for tensor requests: inputs named by the model's
    input signature (a dynamic batch dimension), the output `probabilities` (classifiers) or
    `predictions` (regressions), float32. Raw records' preprocessing stays outside it; the data spec
    is in its metadata. Models built from zmqflow's layers and the built-in MLP export; PyTorch and
    JAX models export from their own framework. Exit 2 when the model cannot be exported (or the
    onnx package is missing: pip install 'zmqflow[onnx]'), 1 when the checkpoint cannot be read."""
    from zmqflow.jobs.export import export_checkpoint
    try:
        written = export_checkpoint(checkpoint_dir, out, fmt, opset, model_name, trust_checkpoint_code)
    except (FailedPreconditionError, UnimplementedError) as exc:
        raise CannotExport(f"{type(exc).__name__}: {exc}") from None
    if as_json:
        click.echo(json.dumps(written))
        return
    ops = ", ".join(f"{op} {n}" for op, n in sorted(written["ops"].items()))
    click.echo(f"wrote {written['path']} ({written['bytes']:,} bytes, ONNX opset {written['opset']}): model "
               f"{written['model']} step {written['step']} from {written['checkpoint']}")
    click.echo(f"  inputs:  {_tensors(written['inputs'])}")
    click.echo(f"  outputs: {_tensors(written['outputs'])}")
    click.echo(f"  {written['nodes']} nodes: {ops}")


def _tensors(values):
    return ", ".join(f"{v['name']} {v['shape']} {v['dtype']}" for v in values)
