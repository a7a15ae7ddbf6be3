"""`zmqflow keys generate DIR`: the CURVE keys every service and client of one deployment share."""

import os

import click

from zmqflow.common.rpc import encryption as curve
from zmqflow.common.errors import InvalidArgumentError


@click.group()
def keys():
    """ZeroMQ CURVE keys: encryption and client authentication for every service."""


def _client_names(value):
    """'3' -> client, client-2, client-3; 'alice,bob' -> client, alice, bob."""
    value = value.strip()
    if value.isdigit():
        n = int(value)
        if n < 1:
            raise click.BadParameter("at least one client key pair is needed")
        return [curve.CLIENT] + [f"{curve.CLIENT}-{i}" for i in range(2, n + 1)]
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise click.BadParameter("give a number of clients or their names, comma separated")
    return names


@keys.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--clients", default="1", show_default=True,
              help="Number of client key pairs (client, client-2, ...) or their names, comma separated; "
                   "'client', the pair clients use by default, is always made.")
@click.option("--force", is_flag=True, help="Replace the keys DIRECTORY already holds.")
@click.option("--keep", is_flag=True,
              help="Keep (and check) the keys DIRECTORY already holds instead of failing: a set-up step that runs "
                   "on every start, as the compose file's `keys` service, makes them once.")
def generate(directory, clients, force, keep):
    """Make DIRECTORY/server.key[_secret], one client.key[_secret] per client and authorized/.

    Start every service with --curve-dir DIRECTORY (or ZMQFLOW_CURVE_DIR set);
    clients read ZMQFLOW_CURVE_DIR. Secret files are readable by their owner
    only; remove a client's key from authorized/ to refuse it (services read
    authorized/ when they start).
    """
    if keep and not force and os.path.exists(os.path.join(directory, f"{curve.SERVER}.key")):
        try:   # check what is there, add the client pairs named since (a deployment's role keys)
            curve.check_dir(directory)
            names = [curve.client_roles(spec)[0] for spec in _client_names(clients)]
            missing = [name for name in names if not os.path.exists(os.path.join(directory, f"{name}.key_secret"))]
            for name in curve.generate(directory, _client_names(clients), keep=True):
                curve.ClientKeys(directory, name)
        except InvalidArgumentError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"keeping the keys in {directory}" + (f"; added {', '.join(missing)}" if missing else ""))
        return
    try:
        names = curve.generate(directory, _client_names(clients), force=force)
    except InvalidArgumentError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"server key pair and {len(names)} client key pair(s) ({', '.join(names)}) in {directory}; "
               f"start services with --curve-dir {directory} and clients with {curve.ENV}={directory}")
