"""`zmqflow checkpoint`: look into a checkpoint, convert one of the first format.

    zmqflow checkpoint inspect ckpt            # variables, shapes, dtypes, slots, files, step, model
    zmqflow checkpoint inspect ckpt --json
    zmqflow checkpoint convert old-ckpt        # .npy piece files -> safetensors, in place
"""

import json

import click



@click.group(name="checkpoint", context_settings={"show_default": True})
def checkpoint():
    """Checkpoints: list what one holds, convert the first format to safetensors."""


@checkpoint.command(name="inspect")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the description as JSON instead of a table.")
def inspect(directory, as_json):
    """List the variables of a checkpoint (DIRECTORY: a checkpoint directory, whose `latest` is shown, or
    one ckpt-<step>) with their shapes, dtypes, optimizer slots and files, its step and the model and
    data it was trained with."""
    from zmqflow.common.checkpoints.inspect import describe, format_table
    description = describe(directory)
    click.echo(json.dumps(description, indent=1) if as_json else format_table(description))


@checkpoint.command(name="convert")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="Write the converted checkpoints here (same ckpt-<step> names, `latest` too). "
                   "Default: replace them in DIRECTORY.")
def convert(directory, out):
    """Rewrite checkpoints of the first format (one .npy file per piece) as safetensors files, one per
    shard, with the same step, config and variables (DIRECTORY: a checkpoint directory, all of whose
    checkpoints are converted, or one ckpt-<step>). Checkpoints already in the new format are left as
    they are (copied with --out)."""
    from zmqflow.common.checkpoints.convert import convert as convert_checkpoints
    try:
        done = convert_checkpoints(directory, out)
    except OSError as exc:
        raise click.ClickException(f"cannot convert {directory}: {exc}") from None
    for source, written in done:
        click.echo(f"{source} -> {written}" if written else f"{source}: already safetensors")
