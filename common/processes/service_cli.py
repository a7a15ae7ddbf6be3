"""What every service's command line shares: bind, ready file, logging, limits."""

import dataclasses
import functools
import json
import logging
import os
import re

import click

from zmqflow.common import bind as binds
from zmqflow.common.rpc import admin_token, encryption as curve
from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.common.spec_files import read_spec_file
from zmqflow.common.wire.limits import DEFAULT_LIMITS
from zmqflow.common.memory import keep_freed_memory
from zmqflow.common.renames import read_environment, warn_renamed_option

METRICS_BIND_ENV = "ZMQFLOW_METRICS_BIND"
METRICS_BIND_OLD_ENV = "ZMQFLOW_METRICS_PORT"

_UNITS = {"": 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12,
          "ki": 2 ** 10, "mi": 2 ** 20, "gi": 2 ** 30, "ti": 2 ** 40}


class ByteSize(click.ParamType):
    """A byte count: 1000000, 512M, 4GiB (0 = unlimited)."""

    name = "bytes"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        m = re.fullmatch(r"\s*(\d+)\s*([kmgt]i?)?b?\s*", str(value), re.IGNORECASE)
        if not m:
            self.fail(f"{value!r} is not a byte count (e.g. 1000000, 512M, 4GiB)", param, ctx)
        return int(m.group(1)) * _UNITS[(m.group(2) or "").lower()]


class BindAddress(click.ParamType):
    """Where a service listens (common/bind.py: `[HOST:]PORT` or a URL, the one parser of every --*-bind): the
    ZeroMQ endpoint (`zmq`: a bare PORT on 127.0.0.1), else the parsed Bind, whose socket_address() a TCP
    listener of our own binds (HTTP, gRPC, metrics)."""

    name = "[HOST:]PORT|URL"

    def __init__(self, zmq=True):
        self.zmq = zmq

    def convert(self, value, param, ctx):
        if isinstance(value, binds.Bind):
            return value   # converted already
        try:
            parsed = binds.parse_bind(value, zmq=self.zmq)
        except InvalidArgumentError as exc:
            self.fail(str(exc), param, ctx)
        return parsed.zmq_endpoint() if self.zmq else parsed


BIND_HELP = "PORT (on 127.0.0.1), HOST:PORT (0.0.0.0:PORT: every interface) or a URL; port 0 picks a free one"
"""How every --*-bind reads its value (common/bind.py), as --help says it."""


class RenamedOption(click.Option):
    """A click option that also answers to its old spellings (`old_names`: old -> the new spelling it means,
    or a list of old spellings of the first name): hidden from --help, the old spelling still works and
    prints one warning naming the new one."""

    def __init__(self, param_decls=None, old_names=(), old_scale=None, **attrs):
        super().__init__(param_decls, **attrs)
        if not isinstance(old_names, dict):
            old_names = dict.fromkeys(old_names, self.opts[0])
        self.old_names = old_names
        self.old_scale = old_scale or {}   # old spelling -> factor to the new unit (milliseconds: 0.001)

    def _old_dest(self, old):
        return f"{self.name}\0{old}"

    def add_to_parser(self, parser, ctx):
        """Each old spelling parses as the spelling it stands for, into a slot of its own (consume_value
        then knows it was used)."""
        calls = []

        class Recorder:
            def add_option(self, **option):
                calls.append(option)
        super().add_to_parser(Recorder(), ctx)
        for call in calls:
            parser.add_option(**call)
            for old, new in self.old_names.items():
                if new in call["opts"]:
                    parser.add_option(**{**call, "opts": [old], "dest": self._old_dest(old)})

    def consume_value(self, ctx, opts):
        used = {old: opts[self._old_dest(old)] for old in self.old_names if self._old_dest(old) in opts}
        if used:
            opts = dict(opts)
            for old, value in used.items():
                scale = self.old_scale.get(old)
                if scale is not None:
                    warn_renamed_option(old, f"{self.old_names[old]} ({old} {value} is "
                                             f"{self.old_names[old]} {_scaled(value, scale)})")
                    value = _scaled(value, scale)
                else:
                    warn_renamed_option(old, self.old_names[old])
                if self.multiple:
                    opts[self.name] = list(opts.get(self.name) or ()) + list(value)
                elif self.name not in opts:          # both spellings given: the new one wins
                    opts[self.name] = value
        return super().consume_value(ctx, opts)


def _scaled(text, scale):
    """An old spelling's value in the new unit (text that is no number is left for the option's type to refuse)."""
    try:
        return f"{float(text) * scale:g}"
    except (TypeError, ValueError):
        return text


def option(*param_decls, old_names=(), old_scale=None, **attrs):
    """click.option, plus `old_names`: the hidden spellings it had before the vocabulary (docs/cli.md), and
    `old_scale`: old spelling -> the factor that turns its value into the new unit."""
    return click.option(*param_decls, cls=RenamedOption, old_names=old_names, old_scale=old_scale, **attrs)


def deprecated_option(name, use, callback=None, **attrs):
    """A hidden option that is not a plain rename (its value moved into another option, `use`): still
    works, through `callback`, and warns naming `use`."""
    def warn_then_call(ctx, param, value):
        if value not in (None, (), False):
            warn_renamed_option(name, use)
        return callback(ctx, param, value) if callback else value
    return click.option(name, hidden=True, callback=warn_then_call, **attrs)


def address_option(help):
    """--address HOST:PORT (or a ZeroMQ URL): the one service a client command talks to. The positional
    ADDRESS these commands took before still works, hidden, with a warning."""
    def decorate(fn):
        @functools.wraps(fn)
        def with_address(*args, address, old_address, **kwargs):
            if old_address is not None:
                warn_renamed_option("the positional ADDRESS", "--address ADDRESS")
                if address is not None and address != old_address:
                    raise click.UsageError(f"two addresses: --address {address} and {old_address}")
                address = old_address
            if address is None:
                raise click.UsageError("Missing option '--address' (HOST:PORT or a ZeroMQ URL such as "
                                       "tcp://127.0.0.1:5555).")
            return fn(*args, address=address, **kwargs)
        with_address = click.argument("old_address", required=False, cls=_HiddenArgument)(with_address)
        return click.option("--address", default=None, metavar="HOST:PORT", help=help)(with_address)
    return decorate


class _HiddenArgument(click.Argument):
    """A positional argument left out of the usage line (a deprecated spelling)."""

    def get_usage_pieces(self, ctx):
        return []


def service_options(default_bind):
    """The options every service takes, in one decorator."""
    def decorate(fn):
        options = [
            bind_option(default_bind),
            click.option("--ready-file", type=click.Path(dir_okay=False), default=None,
                         help="Write the bound endpoint to this file once serving (for scripts and tests)."),
            click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"])),
            option("--client-timeout-secs", "client_timeout", old_names=["--client-timeout"], default=30.0,
                   help="Seconds a client holding blocked requests may stay silent before they are cancelled."),
            click.option("--max-message-bytes", default=DEFAULT_LIMITS.max_message_bytes,
                         help="Largest request accepted; bigger ones are answered INVALID_ARGUMENT."),
            click.option("--max-connections", type=click.IntRange(1), default=DEFAULT_LIMITS.max_connections,
                         help="Connections served at once (at most half of RLIMIT_NOFILE); past it a new peer "
                              "closes the oldest idle one, else itself (docs/security.md)."),
            option("--handshake-timeout-secs", "handshake_timeout", old_names=["--handshake-timeout"],
                   type=click.FloatRange(0.1),
                   default=DEFAULT_LIMITS.handshake_timeout_ms / 1000,
                   help="Seconds a new connection has to finish the ZeroMQ handshake before it is closed."),
            click.option("--max-unread-reply-bytes", type=ByteSize(), default=DEFAULT_LIMITS.max_unread_reply_bytes,
                         help="Reply bytes a client may leave unread; past it its requests are answered "
                              "RESOURCE_EXHAUSTED until it reads."),
            click.option("--max-parked-per-client", type=click.IntRange(1),
                         default=DEFAULT_LIMITS.max_parked_per_client,
                         help="Requests one client may have waiting in the service; past it RESOURCE_EXHAUSTED."),
            curve_option("Encrypt with ZeroMQ CURVE and accept only the clients in DIR/authorized/ "
                         "(keys from `zmqflow keys generate DIR`)", serves=True),
            admin_token_option("Without CURVE, the service's admin ops (shutdown; a ps's init and restore, a "
                               "broker's reset) need this token: read it from FILE. Else it comes from "
                               f"{admin_token.ENV}, or the service makes one and writes it, readable by this user "
                               f"only, to the runtime directory (${admin_token.RUNTIME_ENV}, $XDG_RUNTIME_DIR/zmqflow "
                               "or ~/.zmqflow/runtime) as admin-token-tcp-HOST-PORT, where clients on this machine "
                               "find it"),
            admin_token_option("Without CURVE, the service's member ops (a ps's push, pull, assign, save, preload, "
                               "worker_done; a broker's queue ops but size/list) need the job's token: read it from "
                               f"FILE. Else it comes from {admin_token.JOB_TOKEN.env}, or the service makes one and "
                               "writes it as job-token-tcp-HOST-PORT beside the admin token", admin_token.JOB_TOKEN),
            click.option("--insecure", is_flag=True, envvar=curve.INSECURE_ENV, expose_value=False,
                         callback=lambda ctx, param, value: os.environ.__setitem__(curve.INSECURE_ENV, "1")
                         if value else None,
                         help="Listen beyond loopback without CURVE anyway (refused otherwise, as Redis's protected "
                              f"mode: anyone who reaches the port may then use it). Also read from "
                              f"{curve.INSECURE_ENV}."),
        ]
        for decorator in reversed(options):
            fn = decorator(fn)
        return ops_options(fn)
    return decorate


def bind_option(default, help="Where the service listens: " + BIND_HELP + ", named by the ready file and the log "
                              "(a ZeroMQ URL: tcp://, ipc://)."):
    """--bind [HOST:]PORT or a ZeroMQ URL (V5), read by common/bind.py; the command gets the ZeroMQ endpoint."""
    return click.option("--bind", default=default, type=BindAddress(), metavar="[HOST:]PORT|URL", help=help)


def curve_option(what="Connect over ZeroMQ CURVE with the client keys in DIR (from `zmqflow keys generate DIR`), "
                      "checking each service's key; processes this command starts do the same", serves=False):
    """--curve-dir for a service or a client command: checked (the server pair too when it `serves`),
    then put in the environment, where every RpcClient, Service and child process of this command finds it."""
    check = curve.check_dir if serves else curve.ClientKeys

    def use_curve_dir(ctx, param, value):
        if value:
            try:
                check(value)
            except InvalidArgumentError as exc:
                raise click.BadParameter(str(exc)) from None
            os.environ[curve.ENV] = os.path.abspath(value)
    return click.option("--curve-dir", envvar=curve.ENV, expose_value=False, callback=use_curve_dir,
                        type=click.Path(file_okay=False), default=None,
                        help=f"{what}. Also read from {curve.ENV}.")


def admin_token_option(what="Send this file's admin token with admin ops (shutdown, init, restore, reset) when "
                             "CURVE is off. Default: $" + admin_token.ENV + ", else the token file the service "
                             "wrote on this machine", kind=admin_token.ADMIN_TOKEN):
    """--admin-token-file (--job-token-file for the job token): checked, then put in the environment, where the
    Service or RpcClient finds it."""
    def use_token_file(ctx, param, value):
        if value:
            try:
                admin_token.read_token_file(value, kind)
            except InvalidArgumentError as exc:
                raise click.BadParameter(str(exc)) from None
            os.environ[kind.file_env] = os.path.abspath(value)
    return click.option(kind.option, envvar=kind.file_env, expose_value=False,
                        callback=use_token_file, type=click.Path(dir_okay=False), default=None,
                        help=f"{what}. Also read from {kind.file_env}.")


def launcher_curve_option():
    """--curve-dir of the commands that start services themselves (train, sweep, ensemble, up)."""
    return curve_option("Run the services this command starts, and their clients, over ZeroMQ CURVE with the "
                        "keys in DIR (from `zmqflow keys generate DIR`)", serves=True)


def ops_options(fn):
    """--metrics-bind, --log-format: how any task (service, worker, reader) is operated."""
    from zmqflow.common.processes import logs, metrics

    def use_metrics_bind(ctx, param, value):
        if value is None:
            value = read_environment(METRICS_BIND_ENV, old=METRICS_BIND_OLD_ENV)
            value = None if value is None else param.type_cast_value(ctx, value)
        for name in (METRICS_BIND_ENV, METRICS_BIND_OLD_ENV):
            os.environ.pop(name, None)   # this task's endpoint: not for the processes it starts
        if value is not None:   # a HOST named here wins over the deprecated --metrics-host
            metrics.request(port=value.port, port_host=value.socket_address()[0] if value.host else None)

    def use_log_format(ctx, param, value):
        if value:
            logs.set_format(value)
    options = [
        option("--metrics-bind", old_names=["--metrics-port"], default=None, metavar="[HOST:]PORT",
               type=BindAddress(zmq=False), expose_value=False, callback=use_metrics_bind,
               help="Serve Prometheus metrics over HTTP here: " + BIND_HELP + " (0.0.0.0:9100 in a container). "
                    "Also read from " + METRICS_BIND_ENV + ". Default: off. The metrics: docs/metrics.md."),
        deprecated_option("--metrics-host", use="--metrics-bind HOST:PORT", expose_value=False,
                          callback=lambda ctx, param, value: metrics.request(host=value)),
        click.option("--log-format", type=click.Choice(logs.FORMATS), envvar=logs.ENV, default=None,
                     expose_value=False, callback=use_log_format,
                     help="text, or json: one JSON object per line (also " + logs.ENV + "). Default: text."),
    ]
    for decorator in reversed(options):
        fn = decorator(fn)
    return fn


def environment_names(command):
    """[(option, its environment variable, [old names])] of a zmqflow-<service> script's options:
    ZMQFLOW_<SERVICE>_<OPTION> from the option's spelling (--client-timeout-secs: ZMQFLOW_BROKER_CLIENT_TIMEOUT_SECS),
    so the names follow the vocabulary as the options do; the old names are what click derived before from the
    Python name (ZMQFLOW_BROKER_CLIENT_TIMEOUT) and from the option's old spellings. Options that name a variable
    of their own (--curve-dir: ZMQFLOW_CURVE_DIR), hidden ones and their old spellings have none."""
    prefix = "ZMQFLOW_" + command.name.upper().replace("-", "_")

    def variable(spelling):
        return f"{prefix}_{spelling.lstrip('-').upper().replace('-', '_')}"
    names = []
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden or param.envvar or not param.allow_from_autoenv:
            continue
        new = variable(param.opts[0])
        old = [variable(param.name)] + [variable(o) for o in getattr(param, "old_names", {})]
        names.append((param, new, [name for name in dict.fromkeys(old) if name != new]))
    return names


def service_main(command):
    """Run a zmqflow-<service> script (its pyproject entry point and `python -m`): each option is also read from
    its environment variable (environment_names; docs/cli.md), an old name with one warning naming the new."""
    for param, new, old in environment_names(command):
        param.envvar = [new, *old]
        used = [name for name in old if os.environ.get(name)]
        if used and not os.environ.get(new):
            warn_renamed_option(used[0], new)
    command.main()


class BadInput(click.ClickException):
    """Bad options or input found once the command runs (a checkpoint that is not there, a bad row): one
    `Error:` line and exit 2, as a usage error (V6, docs/cli.md)."""
    exit_code = 2


def serve_metrics():
    """The --metrics-bind endpoint started (metrics.serve); an address it cannot listen on is a bad
    --metrics-bind (exit 2) instead of a traceback."""
    from zmqflow.common.processes import metrics
    try:
        return metrics.serve()
    except binds.BindError as exc:
        raise click.BadParameter(str(exc), param_hint="--metrics-bind") from None


def setup_logging(level, task):
    """Log lines naming `task`, as text or JSON (--log-format; common/processes/logs.py)."""
    from zmqflow.common.processes import logs
    logs.setup(level, task)


def write_ready_file(path, endpoint):
    """The bound endpoint, written atomically: a launcher polling the file never reads half of it."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(endpoint + "\n")
    os.replace(tmp, path)


def profiled(function, *args, task):
    """function(*args); with ZMQFLOW_PROFILE_DIR set, under cProfile, its stats written there at the end
    as TASK.PID.prof (measure, don't guess)."""
    profile_dir = os.environ.get("ZMQFLOW_PROFILE_DIR")
    if not profile_dir:
        return function(*args)
    import cProfile
    profiler = cProfile.Profile()
    try:
        return profiler.runcall(function, *args)
    finally:
        profiler.dump_stats(os.path.join(profile_dir, f"{task.replace(':', '-')}.{os.getpid()}.prof"))


def run_service_instance(task, make_service, *args, bind, ready_file, log_level, client_timeout, max_message_bytes,
                         max_connections, handshake_timeout, max_unread_reply_bytes, max_parked_per_client, **options):
    """Set up the process, build the service, `make_service(bind, *args, limits=..., client_timeout=...,
    **options)` (a Service class, or a function making one), announce it, serve until SIGTERM.
    The keywords from `bind` to `max_parked_per_client` are service_options' (a command passes them on whole)."""
    setup_logging(log_level, task)
    keep_freed_memory()
    try:   # a bad option value: exit 2, as a usage error (an address that cannot be bound names --bind)
        limits = dataclasses.replace(DEFAULT_LIMITS, max_message_bytes=max_message_bytes,
                                     max_connections=max_connections,
                                     handshake_timeout_ms=round(handshake_timeout * 1000),
                                     max_unread_reply_bytes=max_unread_reply_bytes,
                                     max_parked_per_client=max_parked_per_client)
        service = make_service(bind, *args, limits=limits, client_timeout=client_timeout, **options)
    except binds.BindError as exc:
        raise click.BadParameter(str(exc), param_hint="--bind") from None
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from None
    from zmqflow.common.processes import metrics
    if metrics.requested():  # --metrics-bind: time requests per op, export the service's gauges
        metrics.export_service(service, task)
        service.metrics_address = serve_metrics()
    logging.getLogger(service.name).info("%s listening on %s (pid %d)%s", service.name, service.endpoint, os.getpid(),
                                         " with CURVE" if getattr(service, "curve_dir", None) else "")
    if ready_file:
        write_ready_file(ready_file, service.endpoint)
    profiled(service.run, task=task)
    logging.getLogger(service.name).info("%s stopped", service.name)


TASK_CONFIG = "zmqflow.task_config"
"""ctx.meta key of the task configuration's entries that no flag takes (the worker's config-only fields)."""


def task_config_option(extra_fields=()):
    """--config TASK.json: one task's options as JSON, {"flag-name": value} (or flag_name, or the parameter's
    name), what a launcher renders for a task (jobs/spec.py) in place of dozens of flags. Flags given on the
    command line win over it; `extra_fields` are the keys the command takes from the file only (left in ctx.meta)."""
    def use_config(ctx, param, path):
        if not path:
            return
        try:
            config = read_spec_file(path, "task config")
        except (InvalidArgumentError, NotFoundError) as exc:
            raise click.BadParameter(str(exc)) from None
        if not isinstance(config, dict):
            raise click.BadParameter(f"{path}: expected a JSON object of options, not {type(config).__name__}")
        names, old_names = {}, {}
        for param in ctx.command.params:
            for opt in param.opts:
                names[opt.lstrip("-")] = param.name
            names[param.name] = param.name
            for old, new in getattr(param, "old_names", {}).items():
                if new in param.opts:
                    old_names[old.lstrip("-")] = (param.name, old, new)
        defaults, extra = {}, {}
        for key, value in config.items():
            name = names.get(key) or names.get(key.replace("_", "-"))   # num_epochs as num-epochs
            renamed = old_names.get(key) or old_names.get(key.replace("_", "-"))
            if name is None and renamed:
                name = renamed[0]
                warn_renamed_option(f"{path}: {key!r}", repr(renamed[2].lstrip("-")))
            if name is not None and name != param.name:
                defaults[name] = value
            elif key.replace("-", "_") in extra_fields:
                extra[key.replace("-", "_")] = value
            else:
                raise click.BadParameter(f"{path}: {key!r} is not an option of `{ctx.command.name}`")
        ctx.default_map = {**(ctx.default_map or {}), **defaults}
        ctx.meta[TASK_CONFIG] = extra
    return click.option("--config", "task_config", default=None, is_eager=True, expose_value=False,
                        callback=use_config, type=click.Path(dir_okay=False), metavar="TASK.json",
                        help="This task's options as JSON ({\"option-name\": value}), as launchers write them; "
                             "flags given here win.")


def to_flags(options):
    """The command-line flags of {"option-name": value}: True a bare flag, None and False none, a list the flag
    repeated, anything else its text. Underscores in names become dashes."""
    argv = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [arg for item in value for arg in (flag, str(item))]
        else:
            argv += [flag, str(value)]
    return argv
