"""`zmqflow serve` / `zmqflow-serve`: run one model server."""

import click

from zmqflow.common.processes.service_cli import BadInput, bad_input, option, run_service_instance, service_main, service_options
from zmqflow.common.processes.task_options import model_options, trust_checkpoint_code_option
from zmqflow.models.kernels import BACKENDS, DEFAULT_BACKEND


@click.command(name="serve", context_settings={"show_default": True})
@service_options(default_bind="127.0.0.1:5700")
@click.option("--checkpoint", "checkpoint_dirs", multiple=True, type=click.Path(file_okay=False),
              help="Serve the latest checkpoint in this directory. Repeat to serve an ensemble in this one server: "
                   "each checkpoint on its own device (--devices), their answers combined in process (--combine), "
                   "answered as an aggregator answers.")
@option("--ps", "follow_ps", old_names=["--follow-ps"], multiple=True,
        help="Instead, pull from these ps shard endpoints (repeat, or comma-separated; shard order).")
@click.option("--refresh-secs", default=None, type=float,
              help="Reload parameters this often (newer checkpoint or ps version). Default: 5 with --ps.")
@model_options
@trust_checkpoint_code_option
@click.option("--backend", default=DEFAULT_BACKEND, type=click.Choice(BACKENDS))
@click.option("--max-batch", default=256, help="Most rows run together in one batch.")
@option("--max-delay-secs", "max_delay_secs", old_names=["--max-delay-ms"], old_scale={"--max-delay-ms": 0.001},
        default=0.002, type=click.FloatRange(min=0), help="Longest a request waits for others to join its batch.")
@option("--model-name", "model_name", old_names=["--name"],
        default=None, help="Model name in replies (default: the checkpoint directory's).")
@click.option("--combine", default="mean", metavar="mean|vote|weighted|median|FILE.py:FUNCTION",
              help="Several --checkpoint: how their answers are combined, unless a request names its own (the "
                   "aggregator's --combine).")
@click.option("--min-members", default=1, type=click.IntRange(min=1),
              help="Several --checkpoint: answers a request needs, unless it names its own.")
@click.option("--devices", default=None, metavar="DEVICE,...",
              help="Several --checkpoint: the device of each, in order (/cpu:0 or /gpu:N; each checkpoint runs in "
                   "its own thread, so several may share /cpu:0). Default: /cpu:0 for every one.")
@click.option("--weights", default=None, metavar="WEIGHT,...",
              help="Several --checkpoint: the weight of each, in order, for --combine weighted (and a function of "
                   "yours). Default: 1 each.")
@click.option("--data", "data_spec", default=None,
              help="A data spec (YAML) whose raw feature columns requests may send as records, made into inputs with "
                   "its train split's statistics. Default: the spec the checkpoint records (trained with --data).")
def command(checkpoint_dirs, follow_ps, refresh_secs, model_spec, placement_strategy, max_shard_bytes,
            trust_checkpoint_code, backend, max_batch, max_delay_secs, model_name, combine, min_members, devices,
            weights, data_spec, **service):
    """Answer predict requests from a checkpoint or the live ps shards, batching concurrent requests.

    A request sends the model's inputs as tensors (their names, shapes and dtypes are the model's
    input signature, reported by model_info) or, for a model trained with --data, the raw feature
    columns as records; its answer then names the predicted classes.

    Several --checkpoint make one server an ensemble (services/serve/ensemble.py): every batch runs
    on each checkpoint at once, each on its device, and each request is combined in process by the
    aggregator's own functions and answered as an aggregator answers (who answered, who is missing)."""
    from zmqflow.services.serve.server import ModelServer, default_model_name

    endpoints = [e for item in follow_ps for e in item.split(",") if e]
    if not checkpoint_dirs and not endpoints:
        raise click.UsageError("give --checkpoint DIR or --ps ENDPOINT")
    ensemble = len(checkpoint_dirs) > 1
    if endpoints and checkpoint_dirs:
        raise click.UsageError("give --checkpoint DIR (repeat for an ensemble) or --ps ENDPOINT, not both")
    devices = _one_each(devices, checkpoint_dirs, "--devices", "devices", str)
    weights = _one_each(weights, checkpoint_dirs, "--weights", "weights", _weight)
    if not ensemble and (devices or weights or combine != "mean" or min_members != 1):
        raise click.UsageError("--devices, --weights, --combine and --min-members are for an ensemble: repeat "
                               "--checkpoint")
    checkpoint_dir = checkpoint_dirs[0] if checkpoint_dirs else None
    if refresh_secs is None and endpoints:
        refresh_secs = 5.0
    from zmqflow.common.checkpoints.checkpoint import Checkpoint, find_checkpoint
    from zmqflow.common.errors import OpError, PermissionDeniedError
    from zmqflow.models.saved import model_spec_of
    try:
        specs = [model_spec_of(Checkpoint(find_checkpoint(d)), model_spec, trust_checkpoint_code)
                 for d in checkpoint_dirs] or [model_spec_of(None, model_spec, trust_checkpoint_code)]
    except PermissionDeniedError as exc:   # it names code not trusted: refused, exit 1 as evaluate and predict do
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    except OpError as exc:   # a checkpoint that is not there or malformed: bad input, exit 2 (V6)
        raise BadInput(f"{type(exc).__name__}: {exc}") from None
    data_config = None
    if data_spec:
        from zmqflow.inputs.data_spec import fit, load_spec, load_tables, to_config
        with bad_input():   # a data spec or data file that cannot be: exit 2 (V6)
            data = load_spec(data_spec)
            fit(data, load_tables(data)["train"])
            data_config = to_config(data)
    if ensemble:
        from zmqflow.services.serve.ensemble import EnsembleServer, default_devices, member_names
        members = list(zip(specs, checkpoint_dirs, devices or default_devices(len(checkpoint_dirs)),
                           weights or [1.0] * len(checkpoint_dirs)))
        run_service_instance("serve", EnsembleServer, members, backend=backend, max_batch=max_batch,
                             max_delay_ms=max_delay_secs * 1000, combine=combine, min_members=min_members,
                             model_name=model_name or "+".join(member_names(checkpoint_dirs)),
                             refresh_secs=refresh_secs, data_config=data_config, **service)
        return
    run_service_instance("serve", ModelServer, specs[0], backend=backend, max_batch=max_batch, max_delay_ms=max_delay_secs * 1000,
                         model_name=model_name or default_model_name(checkpoint_dir, endpoints),
                         checkpoint_dir=checkpoint_dir, ps_endpoints=endpoints, placement_strategy=placement_strategy,
                         max_shard_bytes=max_shard_bytes, refresh_secs=refresh_secs, data_config=data_config, **service)


def _one_each(text, checkpoint_dirs, option, what, parse):
    """A comma-separated list of one value per --checkpoint (None when not given)."""
    if not text:
        return None
    values = [parse(v.strip()) for v in text.split(",")]
    if len(checkpoint_dirs) > 1 and len(values) != len(checkpoint_dirs):
        raise click.BadParameter(f"{len(values)} {what} for {len(checkpoint_dirs)} checkpoints: give one each",
                                 param_hint=option)
    return values


def _weight(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise click.BadParameter(f"weight {text!r} is not a number >= 0", param_hint="--weights")
    return value


def main():
    service_main(command)


if __name__ == "__main__":
    main()
