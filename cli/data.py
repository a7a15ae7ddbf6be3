"""`zmqflow data`: write input files for the readers, so deployments train on the training split only.

    zmqflow data mnist-shards --out /data/mnist        # then: zmqflow reader --preset mnist-shards --files '/data/mnist/*.bin'
    zmqflow data prepare --data my.yaml --model mlp --out /data/prepared
                                                       # then: zmqflow reader --data-config /data/prepared/data-config.json

`mnist-shards` writes the 4,500 training rows of inputs/datasets.py's mnist_split, the same
shards `zmqflow train` writes, none of the 500 rows the chief evaluates on. `prepare` is the
deployments' one-shot data task for any data spec (the compose file's `data` service, an
initContainer of every reader, ps and worker pod in deploy/k8s/).
"""

import os

import click

from zmqflow.common.processes.service_cli import bad_input
from zmqflow.inputs.datasets import RECORD_FORMAT, mnist_split, write_record_shards


@click.group(name="data", context_settings={"show_default": True})
def data():
    """Data: inspect a data spec, write input files for the readers."""


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


@data.command(name="prepare")
@click.option("--data", "data_spec", default="mnist", metavar="SPEC",
              help="A data spec (YAML) or `mnist`, the shipped sample.")
@click.option("--model", "model_spec", default="mlp", metavar="MODEL",
              help="The model to fit to the data's inputs and classes: a built-in name, a spec file or inline JSON, "
                   "or path.py:build.")
@click.option("--model-opt", "model_opts", multiple=True, metavar="KEY=VALUE", help="A model option (repeatable).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory of data-config.json, model.json and the shards (created; replaced on a rerun).")
@click.option("--shards", default=8, type=click.IntRange(1, 1000), help="Number of record files.")
@click.option("--seed", default=0, help="Seed of the row order (every file holds every class).")
def prepare_command(data_spec, model_spec, model_opts, out_dir, shards, seed):
    """A deployment's one-shot data task: fit the spec's statistics on its train split, fit the model
    to its inputs and classes, and write the train split, prepared as the model's inputs and label, as
    fixed-length record shards. Then: `zmqflow reader --data-config OUT/data-config.json`, `zmqflow ps
    --model OUT/model.json`, `zmqflow worker --model OUT/model.json --data-config OUT/data-config.json
    --evaluate` (the chief scores the test split at the end). Bad data exits 2 naming the file, line and
    column; so does a spec, data file or model that is not there."""
    from zmqflow.inputs.data_spec import is_mnist_sample, load_spec
    from zmqflow.inputs.prepared_shards import prepare_for_readers
    from zmqflow.models.spec import resolve_model, with_options
    try:
        with bad_input():   # a spec, data file or model that cannot be: exit 2 (V6)
            model = with_options(resolve_model(model_spec, data_mlp=not is_mnist_sample(load_spec(data_spec))),
                                 model_opts)
            done = prepare_for_readers(data_spec, out_dir, model, shards=shards, seed=seed)
    except OSError as exc:
        raise click.ClickException(f"cannot write to {out_dir}: {exc}") from None
    splits = ", ".join(f"{split} {rows:,}" for split, rows in done["splits"].items())
    click.echo(f"prepared {done['name']} ({done['task']}; rows: {splits}): {done['rows']:,} train rows of "
               f"{done['record_bytes']:,} bytes in {len(done['shards'])} shards, model {done['model']}, in "
               f"{done['directory']}")
    click.echo(f"read them with: zmqflow reader --data-config {os.path.join(done['directory'], 'data-config.json')}")


@data.command(name="inspect")
@click.argument("spec")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def inspect_spec(spec, as_json):
    """Read every split of a data spec (a YAML file, or `mnist`) and print its rows, features, input
    signature and label balance. Bad input (a missing file or column, a malformed row, a label outside
    the classes, a split with no rows) exits 2 naming the file, line and column."""
    import json

    from zmqflow.inputs.data_spec import inspect, load_spec
    with bad_input():
        report = inspect(load_spec(spec))
    if as_json:
        click.echo(json.dumps(report))
        return
    click.echo(f"{report['name']}: {report['format']} data, {report['task']} label {report['label']['columns']}")
    for split, info in report["splits"].items():
        skipped = f", {info['skipped_bad_rows']} bad rows skipped" if info["skipped_bad_rows"] else ""
        click.echo(f"  {split:<10} {info['rows']:>8,} rows from {info['files']} file(s){skipped}")
    click.echo("features:" if report["features_from"] == "the spec" else
               f"features (every column but the label's, typed from the train split: {len(report['features'])}):")
    for f in report["features"]:
        extra = {k: v for k, v in f.items() if k not in ("name", "type", "unknown")}
        click.echo(f"  {f['name']:<16} {f['type']:<12} " + ", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in extra.items()))
        for split, unknown in f.get("unknown", {}).items():
            click.echo(f"    unknown in {split}: {unknown['rows']} row(s) hold values outside the vocabulary "
                       f"({', '.join(map(repr, unknown['values']))}); they share one slot")
    signature = ", ".join(f"{name} {shape} {dtype}" for name, (shape, dtype) in report["input_signature"].items())
    click.echo(f"model inputs: {signature}; outputs: {report['outputs']}")
    for split, balance in report["label"]["per_split"].items():
        click.echo(f"  label in {split:<10} " + ", ".join(
            f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in balance.items()))
