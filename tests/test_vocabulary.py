"""One vocabulary (docs/cli.md): every command's options, walked from click's command tree (the umbrella's
subcommands, recursively, and every zmqflow-* service command), follow the rules V1-V7, encoded here as data;
an old spelling stays a hidden alias that works and warns once, naming the new one."""

import importlib
import os
import re
import subprocess
import sys
import warnings

import click
import pytest
from click.testing import CliRunner

from zmqflow.cli.main import main
from zmqflow.common.bind import Bind
from zmqflow.common.processes.service_cli import BindAddress, RenamedOption, environment_names, option
from zmqflow.common.renames import read_environment, renamed_keywords

pytestmark = pytest.mark.unit

SERVICE_CLIS = ("broker", "ps", "worker", "reader", "serve", "aggregator", "gateway")
"""The per-service commands (pyproject's zmqflow-<name> scripts), walked beside the umbrella's."""

DURATION = re.compile(r"(^|-)(s|sec|secs|seconds|timeout|interval|wait|delay|after|every|lease|ms)$")
"""V2: an option that names a time ends in -secs (seconds) or, for a request's deadline only, -ms."""
DURATION_OK = {"--deadline-ms", "--validate-every-steps", "--checkpoint-every-steps", "--summary-every-steps",
               "--unhealthy-after", "--log-every"}
"""Names the pattern catches that are no durations (steps, failures: --log-every N steps, as TF's LoggingTensorHook
every_n_iter) or the one millisecond option (V2)."""

TASK_COUNTS = {"ps", "workers", "readers", "serve", "servers", "members", "chiefs", "aggregators"}
"""V1: an integer option named for a kind of task counts tasks: --num-<role> (--num-ps, --num-workers)."""

SAME_CONCEPT = [
    ("JSON output to a file: --json-out", {"--summary-out", "--result-file", "--stats-file", "--json-file",
                                           "--output-json", "--report"}),
    ("the one service a client talks to: --address", {"--server", "--endpoint", "--target", "--url"}),
    ("a served model's name: --model-name", {"--name-of-model", "--served-name"}),
    ("where a service listens: --bind / --<what>-bind", {"--listen", "--port", "--host", "--web-port", "--web-host"}),
]
"""Two spellings of one concept: the left name is the vocabulary's, the set the spellings a new option must
not take (each was in use somewhere before the vocabulary)."""

ALLOWLIST = {
    ("up", "--timeout"): "docker compose up --timeout (seconds a service gets to stop): `zmqflow up` keeps "
                         "compose's flags",
    ("up", "--config"): "compose's `config`: print the resolved file (a flag here, as `docker compose config`)",
    ("ps", "--total-num-replicas"): "TensorFlow's SyncReplicasOptimizer(total_num_replicas=)",
    ("up", "--no-deps"): "docker compose up --no-deps",
    ("up", "--wait"): "docker compose up --wait (a switch: return once healthy; --wait-secs bounds it)",
    ("down", "--timeout"): "docker compose down --timeout (seconds a service gets to stop)",
    ("logs", "--no-color"): "docker compose logs --no-color",
    ("logs", "--no-log-prefix"): "docker compose logs --no-log-prefix",
    ("ps", "--services"): "docker compose ps --services (a switch: list the services' names)",
}
"""(command or *, option): why it may break a rule (a name that is standard elsewhere)."""


def commands():
    """(path, click command) of every command: the umbrella's tree and the service CLIs."""
    found = []

    def walk(command, path, parent):
        ctx = click.Context(command, info_name=path[-1], parent=parent)
        found.append((" ".join(path), command))
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), path + [name], ctx)
    walk(main, ["zmqflow"], None)
    for name in SERVICE_CLIS:
        walk(importlib.import_module(f"zmqflow.services.{name}.cli").command, [f"zmqflow-{name}"], None)
    return found


def visible_options(command):
    """The options --help shows, each with its spellings (hidden options and deprecated aliases left out)."""
    return [p for p in command.params if isinstance(p, click.Option) and not p.hidden]


def allowed(path, name):
    return (path.split()[-1], name) in ALLOWLIST or ("*", name) in ALLOWLIST


def test_the_walk_finds_every_command():
    paths = {path for path, _ in commands()}
    assert {"zmqflow train", "zmqflow k8s render", "zmqflow bench serve", "zmqflow loadtest",
            "zmqflow-gateway", "zmqflow-reader"} <= paths
    assert len(paths) > 40


def test_every_option_follows_the_vocabulary():
    problems, kinds, names = [], {}, {}
    for path, command in commands():
        for param in visible_options(command):
            for name in param.opts + param.secondary_opts:
                if not name.startswith("--") or allowed(path, name):
                    continue
                stem = name[2:]
                names.setdefault(name, set()).add(path)
                # V7: a flag never takes a value, and one spelling is a flag everywhere or nowhere
                kinds.setdefault(name, set()).add("flag" if param.is_flag else "value")
                if DURATION.search(stem) and name not in DURATION_OK and not stem.endswith("-secs"):
                    problems.append(f"{path} {name}: a duration is --<what>-secs (V2)")
                if stem.endswith("-ms") and name != "--deadline-ms":
                    problems.append(f"{path} {name}: milliseconds only for --deadline-ms (V2)")
                if stem in TASK_COUNTS and isinstance(param.type, click.types._NumberParamTypeBase):
                    problems.append(f"{path} {name}: a count of tasks is --num-{stem} (V1)")
                if stem.startswith("no-") and param.is_flag and not param.secondary_opts:
                    problems.append(f"{path} {name}: a switch is --x/--no-x (V7)")
                if param.secondary_opts and name in param.secondary_opts and name != f"--no-{param.opts[0][2:]}":
                    problems.append(f"{path} {name}: the off side of {param.opts[0]} is --no-{param.opts[0][2:]} (V7)")
                for concept, spellings in SAME_CONCEPT:
                    if name in spellings:
                        problems.append(f"{path} {name}: {concept}")
                if stem == "json" and not param.is_flag:
                    problems.append(f"{path} {name}: --json prints JSON on stdout (a flag); a file is --json-out (V4)")
                if (stem == "bind" or stem.endswith("-bind")) and not isinstance(param.type, BindAddress):
                    problems.append(f"{path} {name}: a --*-bind takes [HOST:]PORT or a URL, read by the one "
                                    "parser, service_cli.BindAddress (V5)")
                if re.search(r"(^|-)(port|host|address|listen)$", stem) and stem != "address":
                    problems.append(f"{path} {name}: where something listens is --<what>-bind [HOST:]PORT, not a "
                                    "--*-port/--*-host pair (V5)")
    problems += [f"{name}: a flag in some commands, takes a value in others: {sorted(names[name])}"
                 for name, seen in kinds.items() if len(seen) > 1]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", ["zmqflow", "zmqflow train", "zmqflow-gateway", "zmqflow k8s render"])
def test_help_hides_the_old_spellings(path):
    command = dict(commands())[path]
    args = path.split()[1:]
    runner = CliRunner()
    result = runner.invoke(main if path.startswith("zmqflow ") or path == "zmqflow" else command,
                           args + ["--help"] if path.startswith("zmqflow ") else ["--help"])
    assert result.exit_code == 0, result.output
    for param in command.params:
        for old in getattr(param, "old_names", {}):
            assert re.search(rf"{re.escape(old)}\b(?!-)", result.output) is None, (path, old)


def test_every_renamed_option_keeps_its_old_spelling_hidden():
    renamed = [(path, p) for path, command in commands() for p in command.params if isinstance(p, RenamedOption)]
    assert len(renamed) > 30
    for path, param in renamed:
        assert param.old_names, (path, param.name)
        for old, new in param.old_names.items():
            assert new in param.opts + param.secondary_opts, (path, old, new)
            assert old not in param.opts + param.secondary_opts, (path, old)


@click.command()
@option("--timeout-secs", "timeout", default=2.0, old_names=["--timeout"])
@option("--delay-secs", "delay", default=0.002, old_names=["--delay-ms"], old_scale={"--delay-ms": 0.001})
@option("--shuffle/--no-shuffle", default=None, old_names={"--fifo": "--no-shuffle"})
@option("--member", multiple=True, old_names=["--peer"])
def _probe(timeout, delay, shuffle, member):
    click.echo(f"{timeout} {delay} {shuffle} {','.join(member)}")


@pytest.mark.parametrize("args, out, warned", [
    ([], "2.0 0.002 None ", []),
    (["--timeout-secs", "3"], "3.0 0.002 None ", []),
    (["--timeout", "3"], "3.0 0.002 None ", ["--timeout is deprecated: use --timeout-secs"]),
    (["--delay-ms", "5"], "2.0 0.005 None ", ["--delay-ms is deprecated: use --delay-secs (--delay-ms 5 is "
                                              "--delay-secs 0.005)"]),
    (["--fifo"], "2.0 0.002 False ", ["--fifo is deprecated: use --no-shuffle"]),
    (["--member", "a", "--peer", "b"], "2.0 0.002 None a,b", ["--peer is deprecated: use --member"]),
    (["--timeout", "3", "--timeout-secs", "4"], "4.0 0.002 None ", ["--timeout is deprecated"]),
])
def test_an_old_spelling_works_and_warns_once(args, out, warned):
    result = CliRunner().invoke(_probe, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == out.strip()
    assert result.stderr.count("deprecated") == len(warned), result.stderr
    for text in warned:
        assert text in result.stderr


def test_an_old_spelling_of_a_real_command_works_and_warns(tmp_path):
    """`zmqflow placement --strategy greedy` (now --placement) answers as the new spelling does."""
    runner = CliRunner()
    new = runner.invoke(main, ["placement", "--num-ps", "2", "--placement", "greedy", "--json"])
    old = runner.invoke(main, ["placement", "--num-ps", "2", "--strategy", "greedy", "--json"])
    assert new.exit_code == old.exit_code == 0, old.output
    assert new.stdout == old.stdout and '"strategy": "greedy"' in old.stdout
    assert "--strategy is deprecated: use --placement" in old.stderr and "deprecated" not in new.stderr


def test_a_positional_address_still_works_and_warns():
    result = CliRunner().invoke(main, ["ping", "127.0.0.1:1", "--timeout-secs", "0.1"])
    assert result.exit_code == 1, result.output    # nobody there: the ping ran, with the old spelling's address
    assert "use --address ADDRESS" in result.stderr and "tcp://127.0.0.1:1" in result.stderr
    missing = CliRunner().invoke(main, ["ping"])
    assert missing.exit_code == 2 and "--address" in missing.output


def test_an_old_keyword_argument_works_and_warns():
    @renamed_keywords(ps="num_ps")
    def job(num_ps=1):
        return num_ps
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert job(ps=3) == 3 and job(num_ps=4) == 4
    assert [str(w.message) for w in caught] == ["ps= is deprecated: use num_ps= (the same thing; ps= will be "
                                                "removed)"]
    assert all(w.category is DeprecationWarning for w in caught)
    with pytest.raises(TypeError, match="give num_ps= only"):
        job(ps=1, num_ps=2)


def test_the_python_api_takes_the_vocabulary_keywords():
    import inspect

    import zmqflow
    for function in (zmqflow.Job.__init__, zmqflow.local_cluster):
        parameters = inspect.signature(function).parameters
        assert {"num_ps", "num_workers"} <= set(parameters) and not {"ps", "workers"} & set(parameters)
        assert function.renamed_keywords == {"ps": "num_ps", "workers": "num_workers"}
    from zmqflow.models.kernels import DEFAULT_BACKEND
    assert inspect.signature(zmqflow.serve).parameters["backend"].default == DEFAULT_BACKEND


def test_one_default_backend_everywhere():
    from zmqflow.models.kernels import DEFAULT_BACKEND
    backends = {path: p.default for path, command in commands() for p in command.params if p.name == "backend"}
    assert len(backends) >= 5 and set(backends.values()) == {DEFAULT_BACKEND}, backends


# ------------------------------------------------------------------ V5: one parser for every --*-bind

def bind_options():
    return [(path, p) for path, command in commands() for p in visible_options(command)
            if any(o == "--bind" or o.endswith("-bind") for o in p.opts)]


def test_every_bind_takes_the_same_forms():
    """PORT (loopback), HOST:PORT and a URL, the same in every service; no host before the colon is refused."""
    binds = bind_options()
    assert {path for path, _ in binds} >= {"zmqflow-broker", "zmqflow-ps", "zmqflow-serve", "zmqflow-aggregator",
                                           "zmqflow-worker", "zmqflow-gateway", "zmqflow-reader", "zmqflow status"}
    for path, param in binds:
        def read(text):
            value = param.type.convert(text, param, None)
            return value.socket_address() if isinstance(value, Bind) else value
        zmq = param.type.zmq
        assert read("5555") == ("tcp://127.0.0.1:5555" if zmq else ("127.0.0.1", 5555)), (path, param.name)
        assert read("0.0.0.0:5555") == ("tcp://0.0.0.0:5555" if zmq else ("0.0.0.0", 5555)), (path, param.name)
        assert read("tcp://127.0.0.1:0") == ("tcp://127.0.0.1:*" if zmq else ("127.0.0.1", 0)), (path, param.name)
        for bad in (":5555", "host:port", "70000", "::1:80"):
            with pytest.raises(click.BadParameter):
                read(bad)


# ------------------------------------------------------------------ environment variables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED = ("common", "models", "inputs", "adapters", "services", "jobs", "cli", "bench", "loadtest", "tests",
           "deploy", "Dockerfile", "docker-compose.yml", "Makefile", "pyproject.toml", "setup.py")
"""Where a ZMQFLOW_* variable may be read or set: the code, the deployment files, the tests (docs are not)."""
TEST_INTERNAL = {"ZMQFLOW_TEST_MARKER": "set by tests/security/test_checkpoint_code.py for the file it runs",
                 "ZMQFLOW_TEST_MODULE": "set by tests for tests/support/collector_off.py, their own child"}
"""Variables a test sets for its own child process: nothing a user sets, so not in docs/cli.md."""
ENV_NAME = re.compile(r"\bZMQFLOW_[A-Z][A-Z0-9_]*[A-Z0-9]\b")


def names_in_code():
    found = {}
    for top in SCANNED:
        path = os.path.join(ROOT, top)
        files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
        for file in files:
            if file.endswith((".py", ".yml", ".yaml", ".in", ".toml", ".sh", ".cfg", "Makefile", "Dockerfile")) \
                    and file != os.path.abspath(__file__):
                with open(file, encoding="utf-8", errors="replace") as f:
                    for name in ENV_NAME.findall(f.read()):
                        found.setdefault(name, os.path.relpath(file, ROOT))
    return found


def documented():
    """docs/cli.md's table of environment variables: {name: old names}, and the table's pattern rows."""
    with open(os.path.join(ROOT, "docs", "cli.md")) as f:
        text = f.read()
    table = text[text.index("## Environment variables"):]
    rows = {}
    for line in table.splitlines():
        if line.startswith("| `ZMQFLOW_"):
            cells = line.split(" | ")
            for name in re.findall(r"`(ZMQFLOW_[A-Z0-9_<>]+)`", cells[0]):
                rows[name] = set(ENV_NAME.findall(cells[-1]))
    return rows


def per_service_variables():
    """{ZMQFLOW_<SERVICE>_<OPTION>: its old names} of every zmqflow-<service> script (and of `python -m
    zmqflow.cli.sweep`)."""
    from zmqflow.cli.sweep import command as sweep
    return {new: old for command in [importlib.import_module(f"zmqflow.services.{n}.cli").command
                                     for n in SERVICE_CLIS] + [sweep]
            for _, new, old in environment_names(command)}


def per_service_names():
    return {name for new, old in per_service_variables().items() for name in (new, *old)}


def test_the_table_of_environment_variables_is_what_the_code_reads():
    rows = documented()
    examples = rows.pop("ZMQFLOW_<SERVICE>_<OPTION>")   # the old names it gives are a script's
    assert examples and examples <= per_service_names(), examples
    table = set(rows) | {old for olds in rows.values() for old in olds}
    code = names_in_code()
    unlisted = {name: where for name, where in code.items()
                if name not in table and name not in TEST_INTERNAL and name not in per_service_names()}
    assert not unlisted, f"read or set in the code but not in docs/cli.md's table: {unlisted}"
    assert table <= set(code), f"in docs/cli.md's table but nowhere in the code: {table - set(code)}"


def published_ports():
    """The compose file's host ports: `127.0.0.1:${ZMQFLOW_X_PORT:-N}:N`, a port only (the host is fixed)."""
    with open(os.path.join(ROOT, "docker-compose.yml")) as f:
        return set(re.findall(r"127\.0\.0\.1:\$\{(ZMQFLOW_[A-Z_]+_PORT)", f.read()))


def test_environment_variables_follow_the_vocabulary():
    """A duration is _SECS, a listener _BIND (a published compose port, host fixed, is _PORT); old names are
    in the table's last column, still read with a warning."""
    rows = documented()
    problems = []
    for name in [n for n in rows if "<" not in n] + sorted(per_service_variables()):
        if re.search(r"_(SECONDS|SEC|S|MS|TIMEOUT|INTERVAL|DELAY|WAIT|DURATION)$", name) and \
                not name.endswith("_DEADLINE_MS"):   # V2: milliseconds for a request's deadline only
            problems.append(f"{name}: a duration is _SECS")
        if re.search(r"_(HOST|ADDR|ADDRESS|URL|ENDPOINT|LISTEN)$", name):
            problems.append(f"{name}: where a task listens is _BIND; a link to a role keeps the role's name")
        if name.endswith("_PORT") and name not in published_ports():
            problems.append(f"{name}: where a task listens is _BIND [HOST:]PORT (V5)")
    assert published_ports() >= {"ZMQFLOW_AGGREGATOR_PORT", "ZMQFLOW_GATEWAY_PORT"}
    assert not problems, "\n".join(problems)


def test_an_old_environment_variable_works_and_warns(capsys):
    assert read_environment("ZMQFLOW_X_BIND", old="ZMQFLOW_X_PORT", environ={"ZMQFLOW_X_PORT": "9"}) == "9"
    assert "ZMQFLOW_X_PORT is deprecated: use ZMQFLOW_X_BIND" in capsys.readouterr().err
    both = {"ZMQFLOW_X_PORT": "9", "ZMQFLOW_X_BIND": "10"}
    assert read_environment("ZMQFLOW_X_BIND", old="ZMQFLOW_X_PORT", environ=both) == "10"
    assert read_environment("ZMQFLOW_X_BIND", old="ZMQFLOW_X_PORT", environ={"ZMQFLOW_X_BIND": ""}) is None
    assert "deprecated" not in capsys.readouterr().err


def test_a_service_scripts_variables_are_named_by_the_options_spelling():
    from zmqflow.services.broker.cli import command
    names = {param.name: (new, old) for param, new, old in environment_names(command)}
    assert names["client_timeout"] == ("ZMQFLOW_BROKER_CLIENT_TIMEOUT_SECS", ["ZMQFLOW_BROKER_CLIENT_TIMEOUT"])
    assert names["bind"] == ("ZMQFLOW_BROKER_BIND", [])
    assert "curve_dir" not in names   # it has its own: ZMQFLOW_CURVE_DIR


@pytest.mark.service
@pytest.mark.parametrize("name, warned", [("ZMQFLOW_BROKER_HANDSHAKE_TIMEOUT_SECS", False),
                                          ("ZMQFLOW_BROKER_HANDSHAKE_TIMEOUT", True)])
def test_a_service_script_reads_its_options_from_the_environment(name, warned):
    """zmqflow-broker with --handshake-timeout-secs from the environment (0.01 is below its minimum: refused at
    once, so nothing starts), under its name and under the old one, which warns."""
    done = subprocess.run([sys.executable, "-m", "zmqflow.services.broker"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, name: "0.01"})
    assert done.returncode == 2 and "Invalid value for '--handshake-timeout-secs'" in done.stderr, done.stderr
    assert ("ZMQFLOW_BROKER_HANDSHAKE_TIMEOUT is deprecated: use ZMQFLOW_BROKER_HANDSHAKE_TIMEOUT_SECS"
            in done.stderr) == warned, done.stderr
