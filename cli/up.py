"""`zmqflow up`: the compose file's services as local processes (see jobs/up/__init__.py)."""

import json
import os
import sys

import click

from zmqflow.common.processes.service_cli import launcher_curve_option, option
from zmqflow.jobs.up.compose import ComposeError, load, resolved_config
from zmqflow.jobs.up.localize import Localizer, share_cores
from zmqflow.jobs.up.logs import Prefixer
from zmqflow.jobs.up.runner import Runner
from zmqflow.jobs.up.topology import check_local_ports, find_chief, select, waits_for_completion


@click.command(name="up", context_settings={"show_default": True})
@launcher_curve_option()
@click.argument("service_names", nargs=-1, metavar="[SERVICE]...")
@click.option("-f", "--file", "compose_file", default="docker-compose.yml", type=click.Path(dir_okay=False),
              help="The compose file.")
@click.option("--services", "service_list", multiple=True, metavar="A,B",
              help="Services to run (repeat or comma-separated), as the SERVICE arguments.")
@click.option("--profile", "profiles", multiple=True, metavar="NAME",
              help="Also run the services of this compose profile (repeatable; also read from COMPOSE_PROFILES, "
                   "comma-separated). A service named as SERVICE runs whatever its profiles.")
@click.option("--env-file", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Variables for the compose file. Default: .env next to it, when it exists; the environment "
                   "wins over both.")
@click.option("--no-deps", is_flag=True, help="Do not also start what the chosen services depend on.")
@click.option("--port-offset", default=0, help="Add N to every port of the topology (hosts that are compose "
              "services, 0.0.0.0 or loopback), in commands, healthchecks and environment (TF_CONFIG too).")
@click.option("--workdir", default=None, type=click.Path(file_okay=False),
              help="Local directory for the compose volumes (volume NAME -> WORKDIR/NAME). Default: .zmqflow-up "
                   "beside the compose file; like Compose's named volumes, it outlives the run (the CURVE keys in "
                   "zmqflow-keys/ for host clients, the checkpoints in zmqflow-data/): delete it for a fresh start.")
@click.option("--exit-code-from", default=None, metavar="SERVICE",
              help="When SERVICE exits, stop the rest and exit with its code. Default: the chief "
                   "(the service whose TF_CONFIG makes it the chief), when it runs.")
@click.option("--keep-running", is_flag=True, help="Do not stop the rest when the chief exits.")
@click.option("--abort-on-failure", is_flag=True, help="Stop every service when one exits non-zero.")
@click.option("--timeout", "stop_timeout", default=10.0, help="Seconds a service may take to stop after SIGTERM.")
@option("--health-timeout-secs", "health_timeout", old_names=["--health-timeout"],
        default=120.0, help="Seconds a service may take to pass its healthcheck.")
@click.option("--color/--no-color", default=None, help="Color the prefixes. Default: when stdout is a terminal.")
@click.option("--dry-run", is_flag=True, help="Print each service's local command and environment, start nothing.")
@click.option("--config", "show_config", is_flag=True,
              help="Print the resolved compose configuration of the chosen services as JSON (what "
                   "`docker compose config` resolves: variables, .env, environment, depends_on, profiles, ports), "
                   "start nothing.")
def command(service_names, compose_file, service_list, profiles, env_file, no_deps, port_offset, workdir,
            exit_code_from, keep_running, abort_on_failure, stop_timeout, health_timeout, color, dry_run,
            show_config):
    """Run the services of a docker-compose file as processes on this machine.

    The file is read as Compose reads it (variables with defaults, nested or
    required, the .env file, environment lists and maps, profiles, depends_on
    conditions; --config prints the result); compose service names resolve to
    127.0.0.1, volumes to local directories; services start in depends_on
    order, a service_healthy dependency once its healthcheck command passes
    here. Logs are prefixed per service. Ctrl-C or SIGTERM stops every process.

    Exit code: that of --exit-code-from when it exits (default: the chief,
    when no chosen service waits for its completion, as the model servers
    do); 130 when interrupted; 1 when a dependency failed or a service
    failed; 0 when every service exited 0.
    """
    names = list(service_names) + [n for item in service_list for n in item.split(",") if n]
    profiles = list(profiles) + [p for p in os.environ.get("COMPOSE_PROFILES", "").split(",") if p]
    try:
        project = load(compose_file, env_file=env_file)
        chosen = select(project, names, with_deps=not no_deps, profiles=profiles)
        if show_config:
            click.echo(json.dumps(resolved_config(project, chosen), indent=1))
            return
        check_local_ports(project, chosen)
        localizer = Localizer(project.services, port_offset, workdir or default_workdir(project.path))
        services = share_cores([localizer.localize(project.services[name]) for name in chosen])
    except (ComposeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if exit_code_from and exit_code_from not in chosen:
        raise click.BadParameter(f"{exit_code_from!r} is not among the services run ({', '.join(chosen)})",
                                 param_hint="--exit-code-from")
    if exit_code_from is None and not keep_running:
        chief = find_chief(services)
        if chief and not waits_for_completion(services, chief):
            exit_code_from = chief
    if dry_run:
        for service in services:
            click.echo(f"{service.name}: {' '.join(service.argv)}")
            for key, value in service.env.items():
                click.echo(f"    {key}={value}")
        return
    prefixer = Prefixer(chosen, sys.stdout, sys.stdout.isatty() if color is None else color)
    prefixer.note(f"zmqflow up: {', '.join(chosen)} (port offset {port_offset}, volumes in {localizer.workdir}"
                  + (f", ends with {exit_code_from})" if exit_code_from else ")"))
    runner = Runner(services, prefixer, os.path.dirname(project.path), exit_code_from, abort_on_failure,
                    stop_timeout, health_timeout)
    sys.exit(runner.run())


def default_workdir(compose_path):
    """.zmqflow-up beside the compose file: its volumes, as Compose keeps a project's named volumes until
    `down -v`, so the keys service's keys are where docs and host clients look (.zmqflow-up/zmqflow-keys)."""
    return os.path.join(os.path.dirname(os.path.abspath(compose_path)), ".zmqflow-up")
