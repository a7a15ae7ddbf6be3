"""`zmqflow sweep`: train many small models in parallel over a grid, a random search or Optuna's TPE; stop
bad ones early with a pruner; resume a killed sweep; keep the best."""

import os
import signal

import click

from zmqflow.cli.train import fitted_data, model_for
from zmqflow.common.processes.service_cli import launcher_curve_option, option, service_main
from zmqflow.jobs.spec import TrainConfig
from zmqflow.jobs.sweep.runner import INPUTS, device_slots
from zmqflow.jobs.sweep.study import PRUNERS, SAMPLERS, run_id
from zmqflow.models.kernels import BACKENDS
from zmqflow.jobs.sweep.space import MLP_ONLY, MODEL_PREFIX, SpaceError, build_space, describe, grid, load_space, parse_grid, sample


def _points(grid_text, space_file, sampler, trials, seed, epochs, batch_size):
    """(space, base, points): the points of a grid or random search; None for tpe, which asks Optuna."""
    if grid_text and space_file:
        raise click.UsageError("give --grid or --space, not both")
    if not grid_text and not space_file:
        raise click.UsageError("give the hyperparameters: --grid 'lr=0.001,0.01;hidden=64,128' or --space FILE")
    base = {"epochs": epochs, "batch_size": batch_size}
    try:
        space = parse_grid(grid_text) if grid_text else load_space(space_file)
        build_space(base)  # the base values are checked like any other
        if sampler == "grid":
            return space, base, grid(space, base)
        if sampler == "random":
            return space, base, sample(space, trials, seed, base)
        return space, base, None
    except SpaceError as exc:
        raise click.BadParameter(str(exc), param_hint="--space" if space_file else "--grid") from None


def _sampler(sampler, trials, random_runs):
    """(sampler, trials): --random N is --sampler random --trials N; grid takes no --trials, the others need it."""
    if random_runs is not None:
        if sampler not in (None, "random") or (trials is not None and trials != random_runs):
            raise click.UsageError("--random N is --sampler random --trials N: give one of them")
        return "random", random_runs
    sampler = sampler or ("random" if trials is not None else "grid")
    if sampler == "grid" and trials is not None:
        raise click.UsageError("--trials sets how many points random and tpe sample; a grid trains every point "
                               "(drop --trials, or add --sampler random or --sampler tpe)")
    if sampler != "grid" and trials is None:
        raise click.UsageError(f"--sampler {sampler} needs --trials N (how many runs to sample)")
    return sampler, trials


@click.command(name="sweep", context_settings={"show_default": True})
@launcher_curve_option()
@click.option("--grid", "grid_text", default=None, metavar="SPEC",
              help="Hyperparameters as NAME=V1,V2;NAME=...: learning_rate (lr), hidden (64 or 128x64 for two "
                   "layers), optimizer (sgd, momentum, adam, adagrad), batch_size, epochs, activation. Every "
                   "combination is trained; with --sampler random or tpe, lists are choices and lo..hi or log:lo..hi ranges "
                   "(learning_rate, batch_size, epochs) are sampled.")
@click.option("--space", "space_file", default=None, type=click.Path(dir_okay=False),
              help="The same as a YAML/JSON file: {lr: [0.001, 0.01], hidden: [64, [128, 64]], "
                   "batch_size: {uniform: [50, 200]}, learning_rate: {log_uniform: [1e-4, 1e-1]}}.")
@click.option("--sampler", type=click.Choice(SAMPLERS), default=None,
              help="How points are chosen: grid (every combination), random (seeded draws: lists are choices, "
                   "ranges sampled), tpe (Optuna's TPE, learning from the runs so far; needs the sweep extra). "
                   "Default: grid, or random with --trials.")
@click.option("--trials", default=None, type=click.IntRange(min=1),
              help="How many runs --sampler random or tpe samples.")
@click.option("--random", "random_runs", default=None, type=click.IntRange(min=1),
              help="Random search: the same as --sampler random --trials N.")
@click.option("--seed", default=0, help="Seed of the random search and of TPE (the same points for the same seed).")
@click.option("--pruner", type=click.Choice(PRUNERS), default="none",
              help="Stop bad runs early (Optuna's pruners; needs the sweep extra): each run's validation is "
                   "reported every --validate-every-steps and the pruner compares it with the other runs' at the "
                   "same step. median: worse than the median of the finished runs; successive-halving and "
                   "hyperband: not in the best 1/4 (1/3 for hyperband, Optuna's reduction factors) of the runs "
                   "that reached the step.")
@click.option("--pruner-startup-trials", default=5, type=click.IntRange(min=0),
              help="The median pruner prunes nothing until this many runs finished (Optuna's n_startup_trials).")
@click.option("--validate-every-steps", default=None, type=click.IntRange(min=1),
              help="With a pruner: validate and report every N global steps (default: one epoch at --batch-size, "
                   "so runs with other batch sizes still report at the same steps).")
@click.option("--parallel", default=None, type=click.IntRange(min=1),
              help="Runs training at once on the default device; each has its own ps task and worker.  "
                   "[default: the number of CPU cores]")
@click.option("--devices", "devices_text", default=None, metavar="LIST",
              help="Train one run per listed device at a time, instead of --parallel: cpu for a CPU slot, a GPU "
                   "index (0 or gpu:0, as zmqflow devices lists them) for a GPU, e.g. cpu,cpu or 0,1,0,1 "
                   "(two runs per GPU).")
@click.option("--resume", is_flag=True,
              help="Continue the sweep in --out where it stopped (killed or interrupted): finished runs stay, "
                   "unfinished ones train again, the others follow. Give the options it was started with "
                   "(needs the sweep extra, which keeps the study in OUT/study.journal).")
@click.option("--epochs", default=3, type=click.IntRange(min=1), help="Epochs of a run unless the space sets them.")
@click.option("--batch-size", default=TrainConfig.batch_size, type=click.IntRange(min=1),
              help="Batch size of a run unless the space sets it.")
@click.option("--out", "out_dir", default="sweep-out", type=click.Path(file_okay=False),
              help="Writes leaderboard.json, leaderboard.csv, sweep.png (with the plot extra), checkpoints/RUN/ "
                   "(the kept runs, each with its model.json: `zmqflow serve --checkpoint DIR --model "
                   "DIR/model.json`), each run's result.json and curve.jsonl in runs/RUN/ and its logs in "
                   "runs/RUN/logs/, the sweep's own logs in logs/, "
                   "and study.journal (the Optuna study, with the sweep extra) here.")
@click.option("--keep-best", default=3, type=click.IntRange(min=0),
              help="Keep the checkpoints of the best K runs (by validation score); delete the others.")
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
def command(grid_text, space_file, sampler, trials, random_runs, seed, pruner, pruner_startup_trials,
            validate_every_steps, parallel, devices_text, resume, epochs, batch_size, out_dir, keep_best, input_kind,
            validation_fraction, split_seed, backend, run_timeout, model_spec, model_opts, data_spec, dry_run, as_json):
    """Train one small MNIST model per hyperparameter point, PARALLEL at once (or one per --devices
    slot), each in its own container (its own ps task, its broker queues in container run-NNN); rank
    them by validation accuracy (or RMSE, lower first, for a regression data spec).

    A failed run is recorded with its error and the sweep goes on. With --pruner, each run reports its
    validation while it trains and a bad run is stopped early (its processes by PID); the leaderboard
    shows it as pruned, at which step, with the best value it reached. --sampler tpe, --pruner and
    --resume use Optuna: pip install 'zmqflow[sweep]'. The kept checkpoints are servable:
    zmqflow serve --checkpoint DIR --model DIR/model.json.
    """
    from zmqflow.jobs.sweep.study import StudyError, import_optuna
    from zmqflow.jobs.sweep.sweep import run_sweep

    sampler, trials = _sampler(sampler, trials, random_runs)
    if validate_every_steps is not None and pruner == "none":
        raise click.UsageError("--validate-every-steps sets how often runs report to a pruner: add --pruner")
    if parallel is not None and devices_text is not None:
        raise click.UsageError("give --parallel (runs on the default device) or --devices (one run per listed "
                               "device), not both")
    space, base, points = _points(grid_text, space_file, sampler, trials, seed, epochs, batch_size)
    try:
        devices = device_slots(devices_text) if devices_text is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--devices") from None
    needs = "--sampler tpe" if sampler == "tpe" else f"--pruner {pruner}" if pruner != "none" else \
        "--resume" if resume else None
    try:
        if needs:
            import_optuna(needs)
    except StudyError as exc:
        raise click.UsageError(str(exc)) from None
    data = fitted_data(data_spec)
    shaping = points if points is not None else grid(   # tpe: every model its choices can shape
        {k: v for k, v in space.items() if k in MLP_ONLY or k.startswith(MODEL_PREFIX)}, base)
    base_model = _base_model(model_spec, model_opts, grid_text or space_file, shaping, data)
    mlp = base_model is None or base_model.get("type") == "mlp"
    if dry_run:
        if points is None:
            click.echo(f"{trials} runs, each point asked of the {sampler} sampler as the sweep goes")
        for i, point in enumerate(points or ()):
            click.echo(f"{run_id(i)}  {describe(point, mlp)}")
        return
    info = {"grid": grid_text, "space": space_file, "random": random_runs, "seed": seed}
    settings = {**info, "sampler": sampler, "trials": trials, "pruner": pruner,
                "pruner_startup_trials": pruner_startup_trials, "validate_every_steps": validate_every_steps,
                "epochs": epochs, "batch_size": batch_size, "model": base_model, "data": data_spec, "input": input_kind,
                "backend": backend, "validation_fraction": validation_fraction, "split_seed": split_seed}
    previous = signal.signal(signal.SIGTERM, _interrupt)  # stop the trainings' processes too, as Ctrl-C does
    try:
        summary = run_sweep(points, out_dir, parallel=parallel or max(1, os.cpu_count() or 1), keep_best=keep_best,
                            input=input_kind, backend=backend, run_timeout=run_timeout,
                            validation_fraction=validation_fraction, split_seed=split_seed, progress=not as_json,
                            info=info, base_model=base_model, data=data, devices=devices, sampler=sampler,
                            space=space, base=base, trials=trials, pruner=pruner,
                            pruner_startup_trials=pruner_startup_trials, validate_every_steps=validate_every_steps,
                            seed=seed, resume=resume, settings=settings)
    except StudyError as exc:
        raise click.UsageError(str(exc)) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        with open(summary["leaderboard_json"]) as f:
            click.echo(f.read())
        return
    for entry in summary["ranked"]:
        click.echo(_row(entry, mlp))
    click.echo(f"{len(summary['ranked'])} runs ({summary['pruned']} pruned, {summary['failed']} failed) in "
               f"{summary['seconds']} s; leaderboard: {summary['leaderboard_json']}, {summary['leaderboard_csv']}")
    click.echo(f"plot: {summary['plot']}" if summary["plot"] else
               "plot skipped: matplotlib is not installed (pip install 'zmqflow[plot]')")
    if summary["kept"]:
        best = summary["kept"][0]
        click.echo(f"serve the best: zmqflow serve --checkpoint {best['checkpoint']} --model {best['model_file']}")


def _row(entry, mlp):
    """One leaderboard line: a finished run's rank and scores; a pruned run's step and best value; a failure's error."""
    label = describe(entry["hyperparameters"], mlp)
    if entry["status"] == "ok":
        return (f"{entry['rank']:>3}  {entry['run_id']}  val {entry['validation_metric']} {entry['validation_score']:.4f}  "
                f"loss {entry['final_loss']:.4f}  {entry['examples_per_s']:>7,} ex/s  {entry['seconds']:5.1f} s  "
                f"{label}{'  [kept]' if entry['kept'] else ''}")
    if entry["status"] == "pruned":
        best = entry.get("best_value")
        return (f"  -  {entry['run_id']}  PRUNED at step {entry['pruned_at_step']} (best val "
                f"{entry['validation_metric']} {'-' if best is None else f'{best:.4f}'})  {entry['seconds']:5.1f} s  "
                f"{label}")
    return f"  -  {entry['run_id']}  FAILED  {label}: {entry['error']}"


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
    service_main(command)


if __name__ == "__main__":
    main()
