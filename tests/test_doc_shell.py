"""The shell lines of the docs against the real commands, as tests/test_docs.py runs their Python.

Every fenced block of README.md, docs/*.md and deploy/**/*.md names its language (```text for output and trees).
Every ```bash / ```sh / ```console block either runs here, in order, in one temporary folder that holds the shipped
files (examples/, deploy/), with loopback ports swapped for free ones and background jobs (`&`) killed at its end,
or sits right under a `<!-- not run here: REASON -->` comment whose reason names the test that runs the same
thing or why nothing can (tests/support/doc_blocks.py has the rule). And every `zmqflow ...` line of every shell
block, run or not, and of the examples' docstrings, names a command that exists with options it takes.
"""

import ast
import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys

import click
import pytest

from zmqflow.cli.main import main
from tests.support import free_port
from tests.support.doc_blocks import ROOT, blocks, every_block, marker_problem

pytestmark = pytest.mark.integration

SHELL = {"bash", "sh", "console"}
BLOCK_SECONDS = 120


def shell_blocks():
    return every_block(SHELL)


def commands(language, body):
    """The command lines of a block (continuations joined); a console block's are its `$ ` lines."""
    lines, out = body.split("\n"), []
    if language == "console":     # the `$ ` lines and their continuations; the rest is output
        kept, going_on = [], False
        for line in lines:
            if line.startswith("$ ") or going_on:
                kept.append(line[2:] if line.startswith("$ ") else line)
            going_on = line.rstrip().endswith("\\") and (line.startswith("$ ") or going_on)
        lines = kept
    current = ""
    for line in lines:
        current += line
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        try:
            shlex.split(current, comments=True)
        except ValueError:      # a quoted string goes on on the next line
            current += "\n"
            continue
        if current.strip():
            out.append(current.strip())
        current = ""
    assert not current.strip(), f"unclosed quotation in {current!r}"
    return out


def script(language, body):
    return "\n".join(commands(language, body)) if language == "console" else body


def zmqflow_calls(command):
    """The argument lists of every `zmqflow ...` in a shell command line (pipes and && split it)."""
    try:
        tokens = shlex.split(command, comments=True)
    except ValueError as exc:
        raise AssertionError(f"{command!r} is not valid shell: {exc}") from None
    calls, current = [], []
    for token in tokens + [";"]:
        if token in ("|", "||", "&&", ";", "&"):
            while current and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", current[0]):
                current.pop(0)   # VAR=value before the command
            if current and os.path.basename(current[0]) == "zmqflow":
                calls.append(current[1:])
            current = []
        else:
            current.append(token)
    return calls


def check_call(args):
    """'' when `zmqflow ARGS` names a command that exists and only options it takes, else what is wrong."""
    command, path, ctx = main, ["zmqflow"], click.Context(main)
    args = list(args)
    while isinstance(command, click.Group):
        words = [a for a in args if not a.startswith("-")]
        if not words or any(a in ("--help", "-h", "--version", "-V") for a in args[:1]):
            return ""
        name = words[0]
        args = args[args.index(name) + 1:]
        sub = command.get_command(ctx, name)
        if sub is None:
            return f"`{' '.join(path)}` has no command {name!r}"
        command, path = sub, path + [name]
    known = {opt for param in command.params for opt in param.opts + param.secondary_opts} | {"--help", "-h"}
    unknown = [a.split("=")[0] for a in args if a.startswith("-") and len(a) > 1 and not re.fullmatch(r"-\d.*", a)
               and a.split("=")[0] not in known]
    return f"`{' '.join(path)}` takes no {', '.join(unknown)}" if unknown else ""


@pytest.mark.unit
def test_every_block_names_its_language_and_every_block_not_run_says_which_test_runs_it_or_why_none_can():
    bare = [str(block) for block in every_block() if not block.language]
    wrong = [f"{block}: `not run here` {marker_problem(block.reason)}" for block in every_block()
             if block.reason is not None and marker_problem(block.reason)]
    assert not bare, f"fenced blocks without a language (```bash, ```console, ```text, ...): {bare}"
    assert not wrong, "\n".join(wrong)
    assert len(shell_blocks()) >= 40, "the docs' shell blocks were not found"


@pytest.mark.unit
def test_the_marker_rule_finds_what_is_wrong():
    assert marker_problem("needs Docker") == "" and marker_problem("a long run (tests/reader runs the readers)") == ""
    assert marker_problem("make test-containers runs it") == ""
    assert marker_problem("") == "gives no reason" and "names neither" in marker_problem("a long run")
    assert marker_problem("tests/no_such_test.py runs it") == "names tests/no_such_test.py, which does not exist"
    assert "the Makefile does not have" in marker_problem("make no-such-target runs it")
    assert blocks("docs/broker.md")[0].reason.startswith("a broker runs until stopped")


def example_commands():
    """(example, command line) of the indented lines of every examples/*.py docstring (what it tells you to run)."""
    found = []
    for path in sorted(glob.glob("examples/*.py", root_dir=ROOT)):
        with open(os.path.join(ROOT, path)) as f:
            docstring = ast.get_docstring(ast.parse(f.read())) or ""
        shown = [line[4:] for line in docstring.split("\n") if line.startswith("    ")]
        found += [(path, command) for command in commands("bash", "\n".join(shown))]
    return found


@pytest.mark.unit
def test_every_zmqflow_line_of_the_docs_and_the_examples_names_real_commands_and_options():
    wrong = []
    for block in shell_blocks():
        for command in commands(block.language, block.body):
            for call in zmqflow_calls(command):
                problem = check_call(call)
                if problem:
                    wrong.append(f"{block}: {problem}: {command}")
    for example, command in example_commands():   # `make examples` runs each script; these are their commands
        problems = [check_call(call) for call in zmqflow_calls(command)]
        words = shlex.split(command, comments=True)
        problems += [f"no file {word}" for word in words if word.endswith(".py") and word.startswith("examples/")
                     and not os.path.exists(os.path.join(ROOT, word))]
        problems += [f"no target {target}" for first, target in zip(words, words[1:]) if first == "make"
                     and f"\n{target}:" not in open(os.path.join(ROOT, "Makefile")).read()]
        wrong += [f"{example}'s docstring: {problem}: {command}" for problem in problems if problem]
    assert not wrong, "\n".join(wrong)
    assert len([c for _, c in example_commands() if zmqflow_calls(c)]) >= 8, example_commands()


def test_check_call_finds_what_is_wrong():
    assert check_call(["train", "--data", "x.yaml", "--epochs", "1"]) == ""
    assert check_call(["trian"]) == "`zmqflow` has no command 'trian'"
    assert check_call(["cluster", "check", "--clustre", "c.yaml"]) == "`zmqflow cluster check` takes no --clustre"
    assert zmqflow_calls("EPOCHS=1 .venv/bin/zmqflow up -d && zmqflow ps | cat") == [["up", "-d"], ["ps"]]


def test_the_shell_blocks_run_as_written(tmp_path):
    """The blocks not marked, in doc order, in one folder (so the README tour's checkpoint serves the later docs)."""
    for shipped in ("examples", "deploy"):
        os.symlink(os.path.join(ROOT, shipped), tmp_path / shipped)
    os.symlink(sys.prefix, tmp_path / ".venv")
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           "PYTHONUNBUFFERED": "1"}
    env.pop("TF_CONFIG", None)
    ports = {}

    def free_ports(text):   # every loopback port of the docs becomes a free one, the same one wherever it recurs
        return re.sub(r"(127\.0\.0\.1|localhost):(\d{4,5})\b",
                      lambda m: f"{m.group(1)}:{ports.setdefault(m.group(2), free_port())}", text)
    ran = []
    for block in shell_blocks():
        if block.reason is not None:
            continue
        source = ("trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT\nset -euo pipefail\n" +
                  free_ports(script(block.language, block.body)))
        proc = subprocess.Popen(["bash", "-c", source], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=BLOCK_SECONDS)
        except subprocess.TimeoutExpired:
            out = f"(still running after {BLOCK_SECONDS} s)"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)   # whatever the block left behind, by its session's id
            except ProcessLookupError:
                pass
            proc.wait()
        assert proc.returncode == 0, f"{block} failed ({proc.returncode}):\n{block.body}\n---\n{out[-4000:]}"
        ran.append(str(block))
    assert len(ran) >= 5, ran
    assert os.path.exists(tmp_path / "ckpt" / "latest") and shutil.which("zmqflow", path=env["PATH"])
