"""The one reader of the YAML and JSON a user writes: data specs, model specs, sweep spaces, cluster
specs, task configs, and the short YAML values of `--model-opt key=value` and sweep grids.

YAML is read as YAML 1.2 (ruamel.yaml), so `classes: [no, yes]` and `vocabulary: [no, se, dk]`
stay the strings the user wrote: YAML 1.1 (PyYAML) reads yes/no/on/off as booleans. Only `true`
and `false` are booleans, `1e-4` is a number, and a date stays its text. A key given twice is an
error, in YAML and in JSON. Every error is one line naming the file, the line and the column.
"""

import functools
import json
import os

from zmqflow.common.errors import InvalidArgumentError, NotFoundError

JSON_SUFFIXES = (".json",)


def read_spec_file(path, what="spec"):
    """The document in a .json file (JSON) or any other file (YAML 1.2, which reads JSON text too).
    NotFoundError when it is not there; InvalidArgumentError naming `what`, the file and the place
    when it does not parse."""
    return _read(path, what, documents=False)


def read_spec_documents(path, what="spec"):
    """Every document of a file, empty ones left out: Kubernetes manifests hold several (`---`)."""
    return _read(path, what, documents=True)


def _read(path, what, documents):
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise NotFoundError(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"{what} {path} cannot be read: {exc}") from None
    if path.lower().endswith(JSON_SUFFIXES):
        doc = parse_json(text, f"{what} {path}")
        return [doc] if documents else doc
    return parse_yaml(text, f"{what} {path}", documents)


def parse_yaml(text, where, documents=False):
    """The YAML 1.2 document in `text` (`documents`: the list of its non-empty documents);
    InvalidArgumentError '<where> is not valid YAML: line L, column C: ...'."""
    from ruamel.yaml.error import MarkedYAMLError, YAMLError
    try:
        if documents:
            return [doc for doc in _yaml().load_all(text) if doc is not None]
        return _yaml().load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        place = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = (exc.problem or exc.context or "").strip()
        if "duplicate key" in problem:
            problem = problem.split(" with value")[0]
        raise InvalidArgumentError(f"{where} is not valid YAML: {place}{problem}") from None
    except YAMLError as exc:
        raise InvalidArgumentError(f"{where} is not valid YAML: {' '.join(str(exc).split())}") from None


def parse_json(text, where):
    """The JSON document in `text` (a key given twice is an error, as in YAML)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"{where} is not valid JSON: line {exc.lineno}, column {exc.colno}: "
                                   f"{exc.msg}") from None
    except _DuplicateKey as exc:
        raise InvalidArgumentError(f"{where} is not valid JSON: key {exc.args[0]!r} is given twice") from None


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs):
    result = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _yaml():
    """A safe YAML 1.2 loader (plain dicts and lists; no tags that build objects; dates stay text). A
    new one per document: a ruamel.yaml loader keeps its parse state, so threads must not share one."""
    from ruamel.yaml import YAML
    loader = YAML(typ="safe", pure=True)
    loader.Constructor = _constructor()
    return loader


@functools.cache
def _constructor():
    from ruamel.yaml.constructor import SafeConstructor

    class TextDates(SafeConstructor):
        """The safe constructor, with a date or time kept as the text the user wrote."""
    TextDates.add_constructor("tag:yaml.org,2002:timestamp", SafeConstructor.construct_yaml_str)
    return TextDates
