"""`zmqflow predict`: predictions of a checkpoint's model for the rows of a file."""

import sys

import click

from zmqflow.common.processes.service_cli import curve_option, option
from zmqflow.common.processes.task_options import trust_checkpoint_code_option


@click.command(name="predict", context_settings={"show_default": True})
@curve_option()
@click.option("--checkpoint", "checkpoint_dir", default=None, type=click.Path(file_okay=False, exists=True),
              help="The latest checkpoint in this directory (trained with --data, which it records).")
@option("--address", "address", old_names=["--server"], default=None, metavar="ENDPOINT",
        help="Instead, ask a running model server or aggregator (e.g. tcp://127.0.0.1:5700) whose model was "
             "trained with --data; only this address is dialled (an aggregator relays its members' schema).")
@click.option("--input", "input_path", required=True, type=click.Path(dir_okay=False, exists=True),
              help="Rows to predict: a file in the data spec's format with its feature columns (the label may be "
                   "absent).")
@click.option("--out", "out_path", default="-", help="Where the predictions go ('-': standard output).")
@click.option("--format", "fmt", default="csv", type=click.Choice(["csv", "jsonl"]),
              help="CSV with a header, or JSON lines.")
@click.option("--data", "data_spec", default=None, metavar="SPEC",
              help="The data spec, when the checkpoint records none.")
@trust_checkpoint_code_option
def command(checkpoint_dir, address, input_path, out_path, fmt, data_spec, trust_checkpoint_code):
    """Read the file's rows as the model's inputs (with the training split's statistics), run the model
    (of a checkpoint, here; or of a running server) and write, per row, the predicted class and each
    class's probability (or the regressed value)."""
    from zmqflow.jobs.predict import predict_file, predict_served, write_predictions
    if (checkpoint_dir is None) == (address is None):
        raise click.UsageError("give --checkpoint DIR or --address ENDPOINT (one of them)")
    if address and data_spec:
        raise click.UsageError("--data goes with --checkpoint; a server uses the spec its checkpoint records")
    columns, rows = (predict_served(address, input_path) if address else
                     predict_file(checkpoint_dir, input_path, data_spec, trust_checkpoint_code=trust_checkpoint_code))
    if out_path == "-":
        write_predictions(columns, rows, sys.stdout, fmt)
    else:
        with open(out_path, "w", newline="") as out:
            write_predictions(columns, rows, out, fmt)
        click.echo(f"{len(rows):,} predictions written to {out_path}", err=True)
