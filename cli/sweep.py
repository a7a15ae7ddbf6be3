"""`zmqflow sweep`: train many small models in parallel over a grid or a random search; keep the best."""

import os
import signal

import click

from zmqflow.cli.train import fitted_data, model_for
from zmqflow.common.processes.service_cli import launcher_curve_option, option
from zmqflow.jobs.spec import TrainConfig
from zmqflow.jobs.sweep.runner import INPUTS
from zmqflow.models.kernels import BACKENDS
from zmqflow.jobs.sweep.space import MLP_ONLY, SpaceError, build_space, describe, grid, load_space, parse_grid, sample


def _points(grid_text, space_file, random_runs, seed, epochs, batch_size):
    if grid_text and space_file:
        raise click.UsageError("give --grid or --space, not both")
    if not grid_text and not space_file:
        raise click.UsageError("give the hyperparameters: --grid 'lr=0.001,0.01;hidden=64,128' or --space FILE")
    base = {"epochs": epochs, "batch_size": batch_size}
    try:
        space = parse_grid(grid_text) if grid_text else load_space(space_file)
        build_space(base)  # the base values are checked like any other
        return sample(space, random_runs, seed, base) if random_runs is not None else grid(space, base)
    except SpaceError as exc:
        raise click.BadParameter(str(exc), param_hint="--space" if space_file else "--grid") from None


@click.command(name="sweep", context_settings={"show_default": True})
@launcher_curve_option()
@click.option("--grid", "grid_text", default=None, metavar="SPEC",
              help="Hyperparameters as NAME=V1,V2;NAME=...: learning_rate (lr), hidden (64 or 128x64 for two "
                   "layers), optimizer (sgd, momentum, adam, adagrad), batch_size, epochs, activation. Every "
                   "combination is trained; with --random, lists are choices and lo..hi or log:lo..hi ranges "
                   "(learning_rate, batch_size, epochs) are sampled.")
@click.option("--space", "space_file", default=None, type=click.Path(dir_okay=False),
              help="The same as a YAML/JSON file: {lr: [0.001, 0.01], hidden: [64, [128, 64]], "
                   "batch_size: {uniform: [50, 200]}, learning_rate: {log_uniform: [1e-4, 1e-1]}}.")
@click.option("--random", "random_runs", default=None, type=click.IntRange(min=1),
              help="Random search: sample this many points from the space instead of the whole grid.")
@click.option("--seed", default=0, help="Seed of the random search (the same points for the same seed).")
@click.option("--parallel", default=max(1, os.cpu_count() or 1), type=click.IntRange(min=1),
              help="Runs training at once (default: the number of CPU cores); each has its own ps task and worker.")
@click.option("--epochs", default=3, type=click.IntRange(min=1), help="Epochs of a run unless the space sets them.")
@click.option("--batch-size", default=TrainConfig.batch_size, type=click.IntRange(min=1),
              help="Batch size of a run unless the space sets it.")
@click.option("--out", "out_dir", default="sweep-out", type=click.Path(file_okay=False),
              help="Writes leaderboard.json, leaderboard.csv, sweep.png and runs/RUN/{checkpoint,logs} here.")
@click.option("--keep-best", default=3, type=click.IntRange(min=0),
              help="Keep the checkpoints of the best K runs (by validation accuracy); delete the others.")
@click.option("--input", "input_kind", default="preloaded", type=click.Choice(INPUTS),
              help="preloaded: fed from memory through a queue in the run's own broker container (run-003); "
                   "ps: held once on the run's own ps task and sliced by its worker.")
@click.option("--validation-fraction", default=0.1, type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="Share of the training split held out (seeded) to rank the runs; never trained on.")
@click.option("--split-seed", default=0, help="Seed of the validation split (keep it to compare sweeps).")
@click.option("--backend", default=TrainConfig.backend, type=click.Choice(BACKENDS), help="Worker kernels.")
@option("--run-timeout-secs", "run_timeout", old_names=["--run-timeout"],
        default=300.0, type=click.FloatRange(min=0, min_open=True),
        help="Seconds a run may take; a run past it is stopped and recorded as failed.")
@click.option("--model", "model_spec", default=None, metavar="MODEL",
              help="The model every run trains (as on zmqflow train: mlp, cnn, logistic, linear, path/model.py:build, a "
                   "spec file or inline JSON). Default: the MLP the hidden and activation axes shape.")
@click.option("--model-opt", "model_opts", multiple=True, metavar="KEY=VALUE",
              help="A model option of every run (repeatable); a model.KEY axis of the grid varies one.")
@click.option("--data", "data_spec", default=None, metavar="SPEC",
              help="Sweep on your data: a data spec (YAML; its validation split, or --validation-fraction of its "
                   "train split, ranks the runs by the task's metric: accuracy, or RMSE for a regression). Default: "
                   "the shipped MNIST sample.")
@click.option("--dry-run", is_flag=True, help="List the runs the space gives and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the leaderboard as JSON (no progress bar).")
def command(grid_text, space_file, random_runs, seed, parallel, epochs, batch_size, out_dir, keep_best, input_kind,
            validation_fraction, split_seed, backend, run_timeout, model_spec, model_opts, data_spec, dry_run, as_json):
    """Train one small MNIST model per hyperparameter point, PARALLEL at once, each in its own container
    (its own ps task, its broker queues in container run-NNN); rank them by validation accuracy (or
    RMSE, lower first, for a regression data spec).

    A failed run is recorded with its error and the sweep goes on. The kept checkpoints are servable:
    zmqflow serve --checkpoint DIR --model DIR/model.json.
    """
    from zmqflow.jobs.sweep.sweep import run_sweep

    points = _points(grid_text, space_file, random_runs, seed, epochs, batch_size)
    data = fitted_data(data_spec)
    base_model = _base_model(model_spec, model_opts, grid_text or space_file, points, data)
    mlp = base_model is None or base_model.get("type") == "mlp"
    if dry_run:
        for i, point in enumerate(points):
            click.echo(f"run-{i + 1:03d}  {describe(point, mlp)}")
        return
    info = {"grid": grid_text, "space": space_file, "random": random_runs, "seed": seed}
    previous = signal.signal(signal.SIGTERM, _interrupt)  # stop the trainings' processes too, as Ctrl-C does
    try:
        summary = run_sweep(points, out_dir, parallel=parallel, keep_best=keep_best, input=input_kind,
                            backend=backend, run_timeout=run_timeout, validation_fraction=validation_fraction,
                            split_seed=split_seed, progress=not as_json, info=info, base_model=base_model,
                            data=data)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        with open(summary["leaderboard_json"]) as f:
            click.echo(f.read())
        return
    for entry in summary["ranked"]:
        if entry["status"] == "ok":
            click.echo(f"{entry['rank']:>3}  {entry['run_id']}  val {entry['validation_metric']} "
                       f"{entry['validation_score']:.4f}  "
                       f"loss {entry['final_loss']:.4f}  {entry['examples_per_s']:>7,} ex/s  {entry['seconds']:5.1f} s  "
                       f"{describe(entry['hyperparameters'], mlp)}{'  [kept]' if entry['kept'] else ''}")
        else:
            click.echo(f"  -  {entry['run_id']}  FAILED  {describe(entry['hyperparameters'], mlp)}: {entry['error']}")
    click.echo(f"{len(points)} runs ({summary['failed']} failed) in {summary['seconds']} s; "
               f"leaderboard: {summary['leaderboard_json']}, {summary['leaderboard_csv']}")
    click.echo(f"plot: {summary['plot']}" if summary["plot"] else
               "plot skipped: matplotlib is not installed (pip install 'zmqflow[plot]')")
    if summary["kept"]:
        best = summary["kept"][0]
        click.echo(f"serve the best: zmqflow serve --checkpoint {best['checkpoint']} --model {best['model_file']}")


def _base_model(model_spec, model_opts, space_text, points, data=None):
    """The spec every run starts from (None: the MLP of the points), after checking that every point's
    model builds: a bad option fails here, before any process starts."""
    from zmqflow.common.errors import OpError
    from zmqflow.jobs.sweep.runner import model_spec as point_model
    from zmqflow.models.registry import load_model
    none_given = model_spec is None and not model_opts and data is None
    base = None if none_given else model_for(model_spec or "mlp", model_opts, data)
    if base is not None and base.get("type") != "mlp":
        shaped = sorted(set(MLP_ONLY) & _given(space_text))
        if shaped:
            raise click.BadParameter(f"{' and '.join(shaped)} {'shape' if len(shaped) > 1 else 'shapes'} the built-in "
                                     f"MLP; {base['type']} takes model.<option> axes instead "
                                     "(e.g. model.filters=[8,16],[16,32])", param_hint="--grid")
    for point in points:
        try:
            load_model(point_model(point, base=base), backend="numpy")
        except OpError as exc:
            raise click.BadParameter(f"the run {describe(point, base is None or base.get('type') == 'mlp')} "
                                     f"cannot build its model: {exc}", param_hint="--model") from None
    return base


def _given(space_text):
    """The axis names the user wrote (not the defaults every point carries)."""
    from zmqflow.jobs.sweep.space import load_space, parse_grid
    if space_text and os.path.isfile(space_text):
        return set(load_space(space_text))
    return set(parse_grid(space_text)) if space_text else set()


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    command(auto_envvar_prefix="ZMQFLOW_SWEEP")


if __name__ == "__main__":
    main()
