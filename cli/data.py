"""`zmqflow data`: write input files for the readers, so deployments train on the training split only.

    zmqflow data mnist-shards --out /data/mnist        # then: zmqflow reader --preset mnist-shards --files '/data/mnist/*.bin'

The compose file runs it as a one-shot service before the reader (a Kubernetes
initContainer in deploy/k8s/reader.yaml): the 4,500 training rows of
inputs/datasets.py's mnist_split, the same shards `zmqflow train` writes, none
of the 500 rows the chief evaluates on.
"""

import os

import click

from zmqflow.inputs.datasets import RECORD_FORMAT, mnist_split, write_record_shards


@click.group(name="data", context_settings={"show_default": True})
def data():
    """Write input files for the readers."""


@data.command(name="mnist-shards")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory of the shards (created; shards of an earlier run are replaced).")
@click.option("--shards", default=8, type=click.IntRange(1, 1000), help="Number of record files.")
@click.option("--seed", default=0, help="Seed of the row order (every file holds every digit).")
def mnist_shards(out_dir, shards, seed):
    """The MNIST training split (not its test rows) as fixed-length record shards: a label byte and
    784 pixel bytes per record, read by `zmqflow reader --preset mnist-shards --files 'OUT/*.bin'`.

    Rerunning rewrites every file atomically (the same seed gives the same bytes)."""
    (train_x, train_y), (_, test_y) = mnist_split()
    try:
        paths = write_record_shards(train_x, train_y, out_dir, shards=shards, seed=seed)
    except OSError as exc:
        raise click.ClickException(f"cannot write the shards to {out_dir}: {exc}") from None
    size = RECORD_FORMAT["record_bytes"]
    click.echo(f"wrote {len(paths)} shards of the MNIST training split ({len(train_y):,} rows of {size} bytes; "
               f"the {len(test_y):,} test rows left out) to {os.path.abspath(out_dir)}:")
    for path in paths:
        nbytes = os.path.getsize(path)
        click.echo(f"  {os.path.basename(path)}  {nbytes // size:,} rows  {nbytes:,} bytes")
    click.echo(f"read them with: zmqflow reader --preset mnist-shards --files '{os.path.join(out_dir, '*.bin')}'")
