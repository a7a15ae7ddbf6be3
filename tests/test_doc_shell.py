"""The shell lines of the docs against the real commands, as tests/test_api_doc.py and test_docs.py run their Python.

Every fenced block of README.md, docs/*.md and deploy/**/*.md names its language (```text for output and trees).
Every ```bash / ```sh / ```console block either runs here, in order, in one temporary folder that holds the shipped
files (examples/, deploy/), with loopback ports swapped for free ones and background jobs (`&`) killed at its end,
or sits right under a `<!-- not run here: REASON -->` comment (Docker, Kubernetes, the network, a long run). And
every `zmqflow ...` line of every shell block, run or not, names a command that exists with options it takes.
"""

import glob
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys

import click
import pytest

from zmqflow.cli.main import main

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(glob.glob("docs/*.md", root_dir=ROOT)) + sorted(
    glob.glob("deploy/**/*.md", root_dir=ROOT, recursive=True))
SHELL = {"bash", "sh", "console"}
NOT_RUN = re.compile(r"<!-- not run here: (.*?) -->")
FENCE = re.compile(r"^```")
BLOCK_SECONDS = 120


def blocks(doc):
    """(language, body, line number, not-run reason or None) of every fenced block of `doc`, in order."""
    lines = open(os.path.join(ROOT, doc), encoding="utf-8").read().split("\n")
    found, i = [], 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            language = lines[i][3:].strip()
            end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
            assert end is not None, f"{doc}:{i + 1}: the block is never closed (it swallows the rest of the file)"
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            reason = NOT_RUN.search(before)
            found.append((language, "\n".join(lines[i + 1:end]), i + 1, reason and reason.group(1).strip()))
            i = end + 1
        else:
            i += 1
    return found


def shell_blocks():
    return [(doc, *block) for doc in DOCS for block in blocks(doc) if block[0] in SHELL]


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
def test_every_block_names_its_language_and_every_shell_block_runs_or_says_why_not():
    bare, unexplained = [], []
    for doc in DOCS:
        for language, body, line, reason in blocks(doc):
            if not language:
                bare.append(f"{doc}:{line}")
            if reason is not None and not reason:
                unexplained.append(f"{doc}:{line}")
    assert not bare, f"fenced blocks without a language (```bash, ```console, ```text, ...): {bare}"
    assert not unexplained, f"`not run here` without a reason: {unexplained}"
    assert len(shell_blocks()) >= 40, "the docs' shell blocks were not found"


@pytest.mark.unit
def test_every_zmqflow_line_of_the_docs_names_real_commands_and_options():
    wrong = []
    for doc, language, body, line, _ in shell_blocks():
        for command in commands(language, body):
            for call in zmqflow_calls(command):
                problem = check_call(call)
                if problem:
                    wrong.append(f"{doc}:{line}: {problem}: {command}")
    assert not wrong, "\n".join(wrong)


def test_check_call_finds_what_is_wrong():
    assert check_call(["train", "--data", "x.yaml", "--epochs", "1"]) == ""
    assert check_call(["trian"]) == "`zmqflow` has no command 'trian'"
    assert check_call(["cluster", "check", "--clustre", "c.yaml"]) == "`zmqflow cluster check` takes no --clustre"
    assert zmqflow_calls("EPOCHS=1 .venv/bin/zmqflow up -d && zmqflow ps | cat") == [["up", "-d"], ["ps"]]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
                      lambda m: f"{m.group(1)}:{ports.setdefault(m.group(2), _free_port())}", text)
    ran = []
    for doc, language, body, line, reason in shell_blocks():
        if reason:
            continue
        source = "trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT\nset -euo pipefail\n" + free_ports(script(language, body))
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
        assert proc.returncode == 0, f"{doc}:{line} failed ({proc.returncode}):\n{body}\n---\n{out[-4000:]}"
        ran.append(f"{doc}:{line}")
    assert len(ran) >= 5, ran
    assert os.path.exists(tmp_path / "ckpt" / "latest") and shutil.which("zmqflow", path=env["PATH"])
