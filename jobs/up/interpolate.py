"""Compose's variable interpolation: `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`,
`${VAR:?error}`, `${VAR?error}`, `${VAR:+alt}`, and `$$` for a literal `$`.

The same file then runs under docker compose and `zmqflow up` with the same values.
"""

import re

_TOKEN = re.compile(r"\$(?:(?P<escaped>\$)|(?P<plain>[A-Za-z_][A-Za-z0-9_]*)|\{(?P<braced>[^{}]*)\})")
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?\Z", re.S)


class InterpolationError(ValueError):
    """A `${VAR:?message}` whose variable is unset, or a malformed `${...}`."""


def interpolate(text, env, where="value"):
    """`text` with every variable replaced from the mapping `env`."""
    def replace(match):
        if match.group("escaped"):
            return "$"
        if match.group("plain"):
            return env.get(match.group("plain"), "")
        return _braced(match.group("braced"), env, where)
    return _TOKEN.sub(replace, text)


def _braced(body, env, where):
    match = _BRACED.match(body)
    if not match:
        raise InterpolationError(f"{where}: invalid interpolation ${{{body}}}")
    name, op, arg = match.group("name"), match.group("op"), match.group("arg")
    value = env.get(name)
    missing = value is None or (op is not None and op.startswith(":") and value == "")
    if op is None:
        return value or ""
    if op.endswith("-"):
        return interpolate(arg, env, where) if missing else value
    if op.endswith("+"):
        return "" if missing else interpolate(arg, env, where)
    if missing:  # '?': required
        raise InterpolationError(f"{where}: required variable {name} is not set: {arg or 'no message'}")
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
