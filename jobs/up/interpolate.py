"""Compose's variable interpolation and its `.env` file.

`$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`,
`${VAR?error}`, `${VAR:+alt}`, `${VAR+alt}`, defaults that nest (`${A:-${B:-x}}`),
and `$$` for a literal `$`; a `$` followed by anything else is an error, as in
Compose. The same file then runs under docker compose and `zmqflow up` with
the same values.
"""

import os
import re

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPS = (":-", ":?", ":+", "-", "?", "+")


class InterpolationError(ValueError):
    """A `${VAR:?message}` whose variable is unset, or a malformed `$` expression."""


def interpolate(text, env, where="value"):
    """`text` with every variable replaced from the mapping `env`."""
    out, i = [], 0
    while True:
        j = text.find("$", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        following = text[j + 1:j + 2]
        if following == "$":
            out.append("$")
            i = j + 2
        elif following == "{":
            end = _closing_brace(text, j + 2)
            if end is None:
                raise InterpolationError(f"{where}: invalid interpolation format in {text!r}: no closing brace")
            out.append(_braced(text[j + 2:end], env, where))
            i = end + 1
        else:
            name = _NAME.match(text, j + 1)
            if not name:
                raise InterpolationError(f"{where}: invalid interpolation format in {text!r} "
                                         "(write $$ for a literal $)")
            out.append(env.get(name.group(0)) or "")
            i = name.end()


def _closing_brace(text, start):
    """The index of the `}` that closes a `${` opened just before `start`, counting nested `${`."""
    depth, i = 1, start
    while i < len(text):
        if text.startswith("$$", i):
            i += 2
            continue
        if text.startswith("${", i):
            depth, i = depth + 1, i + 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _braced(body, env, where):
    name = _NAME.match(body)
    if not name:
        raise InterpolationError(f"{where}: invalid interpolation ${{{body}}}")
    rest = body[name.end():]
    op = next((o for o in _OPS if rest.startswith(o)), None)
    if op is None and rest:
        raise InterpolationError(f"{where}: invalid interpolation ${{{body}}}")
    value = env.get(name.group(0))
    arg = rest[len(op):] if op else ""
    missing = value is None or (op is not None and op.startswith(":") and value == "")
    if op is None:
        return value or ""
    if op.endswith("-"):
        return interpolate(arg, env, where) if missing else value
    if op.endswith("+"):
        return "" if missing else interpolate(arg, env, where)
    if missing:  # '?': required
        message = interpolate(arg, env, where) or "no message"
        raise InterpolationError(f"{where}: required variable {name.group(0)} is not set: {message}")
    return value


def interpolate_tree(node, env, where="compose file"):
    """Every string in a parsed YAML tree interpolated (keys are left alone, as compose does)."""
    if isinstance(node, str):
        return interpolate(node, env, where)
    if isinstance(node, list):
        return [interpolate_tree(item, env, where) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_tree(value, env, f"{where} {key}") for key, value in node.items()}
    return node


def read_env_file(path):
    """The variables of a compose `.env` file: NAME=value lines, `#` comments, optional quotes
    and `export `; {} when the file does not exist."""
    if not os.path.exists(path):
        return {}
    values = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("export "):
                line = line[len("export "):].lstrip()
            name, sep, value = line.partition("=")
            name = name.strip()
            if not sep or not _NAME.fullmatch(name):
                raise InterpolationError(f"{path} line {number}: expected NAME=value, not {line!r}")
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            elif " #" in value:
                value = value.split(" #", 1)[0].rstrip()
            values[name] = value
    return values
