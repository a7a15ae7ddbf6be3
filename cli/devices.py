"""`zmqflow devices`: the CPUs and GPUs a worker on this machine could place layers on."""

import json

import click


def _gib(n):
    return f"{n / 2**30:.1f} GiB"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the devices as a JSON object.")
def devices(as_json):
    """List the CPU and the GPUs (as CuPy sees them after CUDA_VISIBLE_DEVICES) with their memory."""
    from zmqflow.services.worker.devices import default_device, list_devices
    found = list_devices()
    if as_json:
        click.echo(json.dumps({"default_device": default_device(), "devices": found}))
        return
    click.echo(f"{'DEVICE':8} {'TYPE':4} {'MEMORY':>10} {'FREE':>10} {'CORES':>6}  DESCRIPTION")
    for d in found:
        cores = "" if d.get("cores") is None else d["cores"]
        description = d.get("description", "")
        if d.get("compute_capability"):
            description += f" (compute capability {d['compute_capability']})"
        click.echo(f"{d['name']:8} {d['device_type']:4} {_gib(d['memory_total']):>10} {_gib(d['memory_free']):>10} "
                   f"{cores:>6}  {description}")
    if len(found) == 1:
        click.echo("no GPU visible (CuPy missing, no CUDA device, or CUDA_VISIBLE_DEVICES hides them)")
    click.echo(f"default device: {default_device()}")
