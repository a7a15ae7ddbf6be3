"""`zmqflow up` (and `zmqflow compose up|ps|logs|down`): the compose file's services as local processes
(see jobs/up/__init__.py), in the foreground or detached, as `docker compose` runs containers."""

import json
import os
import sys
import threading
import time

import click

from zmqflow.common.processes.service_cli import launcher_curve_option, option
from zmqflow.jobs.up.compose import ComposeError, load, resolved_config
from zmqflow.jobs.up.detached import start_detached, supervise
from zmqflow.jobs.up.localize import Localizer, child_environment, share_cores
from zmqflow.jobs.up.logs import Prefixer
from zmqflow.jobs.up.state import (ProjectFolder, default_workdir, live_services, services_to_json, stop,
                                   supervisor_alive)
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
@click.option("-d", "--detach", is_flag=True,
              help="Run in the background: return once the services are started (with --wait: running and "
                   "healthy); `zmqflow compose ps`, `zmqflow logs [-f]` and `zmqflow down` follow and stop them "
                   "from any shell.")
@click.option("--wait", is_flag=True, help="With -d: return once every service runs and passes its healthcheck "
              "(without one: once it has run for 1 s; one-shot services: once they exited 0); exit 1 when one "
              "fails first.")
@click.option("--wait-secs", default=600.0, type=click.FloatRange(min=0),
              help="With --wait: how long to wait before giving up (exit 1; the run goes on).")
@click.option("--workdir", default=None, type=click.Path(file_okay=False),
              help="The project folder: the compose volumes (volume NAME -> WORKDIR/NAME; the CURVE keys in "
                   "WORKDIR/zmqflow-keys), the run's state and its logs. Default: .zmqflow-up next to the compose "
                   "file; `zmqflow down -v` empties it.")
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
def command(service_names, compose_file, service_list, profiles, env_file, no_deps, port_offset, detach, wait,
            wait_secs, workdir, exit_code_from, keep_running, abort_on_failure, stop_timeout, health_timeout, color,
            dry_run, show_config):
    """Run the services of a docker-compose file as processes on this machine.

    The file is read as Compose reads it (variables with defaults, nested or
    required, the .env file, environment lists and maps, profiles, depends_on
    conditions; --config prints the result); compose service names resolve to
    127.0.0.1, volumes to local directories; services start in depends_on
    order, a service_healthy dependency once its healthcheck command passes
    here. Logs are prefixed per service. Ctrl-C or SIGTERM stops every process.
    A service whose `restart:` policy asks for it (the shipped file's model
    servers, aggregator and gateway: unless-stopped) is started again when
    it exits, after a back-off (0.1 s, doubling while it keeps failing, at
    most 60 s); a finished training task is not.

    \b
    State, logs and volumes live in the project folder (--workdir):
      zmqflow up -d --wait        # detached; returns once healthy
      zmqflow compose ps          # what runs: state, pid, ports, health
      zmqflow logs -f serve0      # a service's output, followed
      zmqflow down                # stop every process (-v: the volumes too)

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
        localizer = Localizer(project.services, port_offset, workdir or default_workdir(compose_file))
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
    if (wait or wait_secs != 600.0) and not detach:
        raise click.UsageError("--wait and --wait-secs go with -d/--detach")
    folder = ProjectFolder(localizer.workdir)
    state = folder.state()
    if supervisor_alive(state):
        raise click.ClickException(f"a run of {state['compose_file']} is already up in {folder.workdir} "
                                   f"(pid {state['supervisor']['pid']}): `zmqflow compose ps` shows it, "
                                   "`zmqflow down` stops it")
    folder.new_run({"compose_file": os.path.abspath(compose_file), "cwd": os.path.dirname(project.path),
                    "names": chosen, "services": services_to_json(services), "exit_code_from": exit_code_from,
                    "abort_on_failure": abort_on_failure, "stop_timeout": stop_timeout,
                    "health_timeout": health_timeout})
    where = (f"zmqflow up: {', '.join(chosen)} (port offset {port_offset}, project folder {folder.workdir}"
             + (f", ends with {exit_code_from})" if exit_code_from else ")"))
    if not detach:
        click.echo(where)
        sys.exit(supervise(folder, sys.stdout, sys.stdout.isatty() if color is None else color))
    try:
        pid = start_detached(folder)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{where}: detached, supervisor pid {pid}")
    if wait:
        _wait_ready(folder, wait_secs)
    click.echo("zmqflow compose ps: what runs; zmqflow logs -f: its output; zmqflow down: stop it")


_SETTLE_SECS = 1.0


def _wait_ready(folder, limit):
    """`up -d --wait`: until every service runs and is healthy (or, one-shot, exited 0); ClickException when one
    fails for good, the run ends, or `limit` seconds pass."""
    deadline = time.monotonic() + limit
    running_since = {}   # a service without a healthcheck is ready once it has run for _SETTLE_SECS (not exited)
    while True:
        state = folder.state()
        services = state["services"]
        failed = [f"{n} exited with code {s.get('exit_code')}" for n, s in services.items()
                  if s["state"] == "exited" and s.get("exit_code")]
        failed += [f"{n} is unhealthy" for n, s in services.items() if s.get("health") == "unhealthy"]
        if failed or not supervisor_alive(state):
            raise click.ClickException(f"zmqflow up --wait: {'; '.join(failed) or 'the run ended'} "
                                       f"(zmqflow logs shows why)")
        now = time.monotonic()
        for n, s in services.items():
            if s["state"] == "running" and s.get("health") is None:
                running_since.setdefault((n, s.get("pid")), now)
        waiting = [n for n, s in services.items() if s["state"] in ("created", "restarting")
                   or s["state"] == "running" and s.get("health") not in (None, "healthy")
                   or s["state"] == "running" and s.get("health") is None
                   and now - running_since[n, s.get("pid")] < _SETTLE_SECS]
        if not waiting:
            click.echo("zmqflow up: every service is running and healthy")
            return
        if time.monotonic() > deadline:
            raise click.ClickException(f"zmqflow up --wait: not ready within {limit:.0f} s: {', '.join(waiting)} "
                                       "(the run goes on: zmqflow compose ps, zmqflow down)")
        time.sleep(0.2)


# ------------------------------------------------------------------ ps, logs, down (docker compose's)


def project_options(short=True):
    """-f/--file and --workdir: which run (the project folder `zmqflow up` was given, by default .zmqflow-up next
    to the compose file). `logs` has no -f for the file: there it is --follow, as in `docker compose logs -f`."""
    def decorate(f):
        f = click.option("--workdir", default=None, type=click.Path(file_okay=False),
                         help="The run's project folder, as given to `zmqflow up`. Default: .zmqflow-up next to "
                              "the compose file.")(f)
        return click.option(*(("-f",) if short else ()), "--file", "compose_file", default="docker-compose.yml",
                            type=click.Path(dir_okay=False), help="The compose file (it need not exist any more).")(f)
    return decorate


def _folder(compose_file, workdir):
    return ProjectFolder(workdir or default_workdir(compose_file))


def _health(folder, state):
    """{name: 'healthy' | 'unhealthy'} of the running services with a healthcheck, checked now, in parallel."""
    import subprocess
    run = folder.run() or {}
    specs = {s["name"]: s for s in run.get("services", [])}
    running = live_services(state)
    results = {}

    def check(name, spec):
        timeout = max(1.0, (spec.get("check") or {}).get("timeout", 5.0))
        try:
            done = subprocess.run(spec["health"], cwd=run.get("cwd"), env=child_environment(spec["env"]),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  timeout=min(timeout, 10.0))
            results[name] = "healthy" if done.returncode == 0 else "unhealthy"
        except (subprocess.TimeoutExpired, OSError):
            results[name] = "unhealthy"
    threads = [threading.Thread(target=check, args=(name, specs[name]), daemon=True)
               for name in running if specs.get(name, {}).get("health")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15.0)
    return results


def _status_rows(folder, state, with_health=True):
    running = live_services(state)
    health = _health(folder, state) if with_health else {}
    rows = []
    for name, s in state["services"].items():
        if name in running:
            status = "running" if s["state"] == "running" else s["state"]
        elif s["state"] in ("running", "restarting"):
            status = "exited (its supervisor is gone)"
        elif s["state"] == "exited":
            status = f"exited ({s.get('exit_code')})"
        else:
            status = s["state"]
        rows.append({"name": name, "state": status, "pid": running.get(name), "restarts": s.get("restarts", 0),
                     "ports": s.get("ports", []), "health": health.get(name, s.get("health") if name in running
                                                                        else None),
                     "restart": s.get("restart"), "log": s.get("log")})
    return rows


@click.command(name="ps", context_settings={"show_default": True})
@project_options()
@click.argument("service_names", nargs=-1, metavar="[SERVICE]...")
@click.option("-a", "--all", "show_all", is_flag=True, help="Also the services that exited (as docker compose ps -a).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", help="Output format.")
@click.option("--json", "as_json", is_flag=True, help="The same as --format json.")
@click.option("-q", "--quiet", is_flag=True, help="Only the pids of the running services.")
@click.option("--services", "only_names", is_flag=True, help="Only the names of the services.")
def ps(compose_file, workdir, service_names, show_all, fmt, as_json, quiet, only_names):
    """What a `zmqflow up` run runs: each service's state (running, restarting, exited and its code), pid,
    restarts, the ports it listens on here and its health (its healthcheck, run now), as `docker compose ps`.

    Exit code 0 (also when nothing is up), 2 for a service that is not in the run."""
    folder = _folder(compose_file, workdir)
    state = folder.state()
    if state is None:
        if as_json or fmt == "json":
            click.echo("[]")
        elif not (quiet or only_names):
            click.echo(f"nothing is up in {folder.workdir}")
        return
    unknown = [n for n in service_names if n not in state["services"]]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: not a service of this run ({', '.join(state['services'])})",
                                 param_hint="SERVICE")
    rows = [r for r in _status_rows(folder, state, with_health=not (quiet or only_names))
            if (not service_names or r["name"] in service_names) and (show_all or r["pid"] is not None)]
    if quiet:
        for row in rows:
            click.echo(row["pid"])
    elif only_names:
        for row in rows:
            click.echo(row["name"])
    elif as_json or fmt == "json":
        click.echo(json.dumps(rows, indent=1))
    else:
        table = [("NAME", "STATE", "PID", "RESTARTS", "HEALTH", "PORTS")] + [
            (r["name"], r["state"], str(r["pid"] or "-"), str(r["restarts"]), r["health"] or "-",
             ", ".join(f"127.0.0.1:{p}" for p in r["ports"]) or "-") for r in rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        for row in table:
            click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


@click.command(name="logs", context_settings={"show_default": True})
@project_options(short=False)
@click.argument("service_names", nargs=-1, metavar="[SERVICE]...")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends (or Ctrl-C).")
@click.option("-n", "--tail", default="all", metavar="N", help="Only the last N lines of each service (or all).")
@click.option("--no-color", is_flag=True, help="No colors in the prefixes.")
@click.option("--no-log-prefix", is_flag=True, help="No `SERVICE  | ` prefix.")
def logs(compose_file, workdir, service_names, follow, tail, no_color, no_log_prefix):
    """The output of a `zmqflow up` run's services (each service's lines, across its restarts), as
    `docker compose logs`; from any shell, also after the run ended, until the next `zmqflow up`."""
    folder = _folder(compose_file, workdir)
    run = folder.run() or {}
    names = run.get("names") or sorted(n[:-4] for n in _listdir(folder.log_dir) if n.endswith(".log"))
    if not names:
        raise click.ClickException(f"no run's logs in {folder.workdir} (`zmqflow up` writes them there)")
    unknown = [n for n in service_names if n not in names]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: not a service of this run ({', '.join(names)})",
                                 param_hint="SERVICE")
    if tail != "all" and not tail.isdigit():
        raise click.BadParameter(f"{tail!r} is not a number of lines (or all)", param_hint="--tail")
    chosen = list(service_names) or names
    prefixer = Prefixer(chosen, sys.stdout, not no_color and sys.stdout.isatty())
    show = (lambda name, text: click.echo(text)) if no_log_prefix else prefixer.line
    offsets = {}
    for name in chosen:
        path = folder.log_path(name)
        lines = _read_lines(path)
        offsets[name] = os.path.getsize(path) if os.path.exists(path) else 0
        for text in (lines if tail == "all" else lines[len(lines) - int(tail):] if int(tail) else []):
            show(name, text)
    if not follow:
        return
    try:
        while True:
            grew = False
            for name in chosen:
                path = folder.log_path(name)
                size = os.path.getsize(path) if os.path.exists(path) else 0
                if size > offsets[name]:
                    with open(path, "rb") as f:
                        f.seek(offsets[name])
                        data = f.read()
                    whole = data[:data.rfind(b"\n") + 1]
                    offsets[name] += len(whole)
                    for text in whole.decode("utf-8", "replace").splitlines():
                        show(name, text)
                    grew = grew or bool(whole)
            if not grew and not supervisor_alive(folder.state()):
                return            # the run ended: as `docker compose logs -f` once every container stopped
            time.sleep(0.2)
    except KeyboardInterrupt:
        return


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def _read_lines(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


@click.command(name="down", context_settings={"show_default": True})
@project_options()
@click.option("-v", "--volumes", is_flag=True, help="Also remove the volumes' directories in the project folder "
              "(checkpoints, prepared data, CURVE keys), as `docker compose down -v`.")
@click.option("-t", "--timeout", "stop_timeout", default=10.0, type=click.FloatRange(min=0),
              help="Seconds a service may take to stop after SIGTERM before SIGKILL.")
def down(compose_file, workdir, volumes, stop_timeout):
    """Stop every process of a `zmqflow up` run (detached or in another shell's foreground) by pid, the last
    started first, as `docker compose down`; its state is dropped (its logs stay until the next run).
    Nothing up: nothing to do (exit 0)."""
    folder = _folder(compose_file, workdir)
    state = folder.state()
    if state is None:
        click.echo(f"zmqflow down: nothing is up in {folder.workdir}")
    else:
        stopped = stop(state, stop_timeout, note=click.echo)
        for name in stopped:
            click.echo(f"zmqflow down: stopped {name}")
        if not stopped:
            click.echo("zmqflow down: no service was running")
    for directory in folder.clear(volumes=volumes):
        click.echo(f"zmqflow down: removed {directory}")
