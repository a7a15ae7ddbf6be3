"""The search space of a sweep: which hyperparameters, which values, and the points to train.

Besides the training hyperparameters, `model.<option>` axes set the model's own options (the
`--model-opt` of `zmqflow train`: `model.filters=[8,16],[16,32]`, values read as YAML);
`hidden` and `activation` shape the built-in MLP only.

No sockets here. A space maps each hyperparameter to a list of values (a grid axis, or
choices when sampling) or a range (`lo..hi`, `log:lo..hi`; sampled only). `grid(space)`
expands every combination; `sample(space, n, seed)` draws n points, the same ones for a
seed. Every point has every hyperparameter (defaults fill the rest) and was checked, so
a typo fails before any process starts, with a message naming the culprit.
"""

import itertools
import math
from collections.abc import Mapping

import numpy as np

from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.common.spec_files import parse_yaml, read_spec_file
from zmqflow.models.spec import ACTIVATIONS

OPTIMIZERS = ("sgd", "momentum", "adam", "adagrad")
DEFAULTS = {"learning_rate": 0.002, "hidden": [100], "optimizer": "adam", "batch_size": 100, "epochs": 3,
            "activation": "sigmoid"}
ALIASES = {"lr": "learning_rate", "batch": "batch_size", "hidden_sizes": "hidden", "opt": "optimizer"}
MODEL_PREFIX = "model."
MLP_ONLY = ("hidden", "activation")


class SpaceError(ValueError):
    """A bad grid or space: the message says what and where."""


class Range:
    """A continuous (or integer) interval, sampled uniformly or log-uniformly."""

    def __init__(self, name, low, high, log=False):
        if not low < high:
            raise SpaceError(f"{name}: range {low}..{high} is empty (the low end must be below the high end)")
        if log and low <= 0:
            raise SpaceError(f"{name}: a log range needs a positive low end, got {low}")
        self.name, self.low, self.high, self.log = name, low, high, log

    def draw(self, rng):
        if self.log:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        if INTEGER[self.name]:
            return int(min(self.high, max(self.low, round(value))))
        return float(value)

    def __repr__(self):
        return f"{'log:' if self.log else ''}{self.low}..{self.high}"


# ------------------------------------------------ checking one value

def _positive_float(name, value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SpaceError(f"{name}: {value!r} is not a number") from None
    if isinstance(value, bool) or not number > 0 or not math.isfinite(number):
        raise SpaceError(f"{name}: must be a positive number, got {value!r}")
    return number


def _positive_int(name, value):
    if isinstance(value, bool):
        raise SpaceError(f"{name}: must be a positive integer, got {value!r}")
    try:
        number = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError):
        number = None
    if number is None or number < 1:
        raise SpaceError(f"{name}: must be a positive integer, got {value!r}")
    return number


def _hidden(name, value):
    """64, "64", "128x64" or [128, 64] -> [128, 64] (one width per hidden layer)."""
    if isinstance(value, str):
        parts = value.lower().split("x")
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = [value]
    if not parts or parts == [""]:
        raise SpaceError(f"{name}: needs at least one hidden layer width, got {value!r}")
    return [_positive_int(f"{name} width", p) for p in parts]


def _choice(choices):
    def check(name, value):
        if value not in choices:
            raise SpaceError(f"{name}: {value!r} is not one of {', '.join(choices)}")
        return value
    return check


CHECKS = {"learning_rate": _positive_float, "hidden": _hidden, "optimizer": _choice(OPTIMIZERS),
          "batch_size": _positive_int, "epochs": _positive_int, "activation": _choice(ACTIVATIONS)}
INTEGER = {"learning_rate": False, "hidden": True, "optimizer": False, "batch_size": True, "epochs": True,
           "activation": False}


def canonical_name(name):
    text = str(name).strip()
    if text.startswith(MODEL_PREFIX):
        if not text[len(MODEL_PREFIX):].isidentifier():
            raise SpaceError(f"{name!r}: a model option axis is model.NAME, NAME a keyword of the model's options")
        return text
    key = text.lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in CHECKS:
        raise SpaceError(f"unknown hyperparameter {name!r}; known: {', '.join(CHECKS)}, model.<option> "
                         f"(aliases: {', '.join(f'{a}={k}' for a, k in ALIASES.items())})")
    return key


def check_value(name, value):
    if name.startswith(MODEL_PREFIX):
        return _model_option(name, value)
    return CHECKS[name](name, value)


def _model_option(name, value):
    """A grid's text read as YAML (8, [8, 16], relu, 0.5), as --model-opt reads it; a file's value as is."""
    if not isinstance(value, str):
        return value
    try:
        return parse_yaml(value, f"{name}: {value!r}")
    except InvalidArgumentError as exc:
        raise SpaceError(str(exc)) from None


def model_options(point):
    """{option: value} of a point's model.<option> axes."""
    return {k[len(MODEL_PREFIX):]: v for k, v in point.items() if k.startswith(MODEL_PREFIX)}


def _split_values(text):
    """'a,[1,2],b' -> ['a', '[1,2]', 'b']: commas inside brackets belong to a value."""
    items, depth, current = [], 0, ""
    for char in text:
        depth += char in "[{("
        depth -= char in "]})"
        if char == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += char
    return items + [current.strip()]


# ------------------------------------------------ building a space

def parse_grid(text):
    """'lr=0.001,0.01;hidden=64,128x64;optimizer=adam,sgd;lr=log:1e-4..1e-1' -> a checked space."""
    if not isinstance(text, str) or not text.strip():
        raise SpaceError("the grid is empty; expected e.g. 'lr=0.001,0.01;hidden=64,128;optimizer=adam,sgd'")
    raw = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, values = part.partition("=")
        if not sep or not name.strip():
            raise SpaceError(f"grid part {part!r} is not NAME=VALUE[,VALUE...]")
        if name.strip() in raw:
            raise SpaceError(f"hyperparameter {name.strip()!r} appears twice in the grid")
        if ".." in values:
            raw[name.strip()] = _parse_range_text(name.strip(), values.strip())
        else:
            items = _split_values(values)
            if any(not v for v in items):
                raise SpaceError(f"grid part {part!r} has an empty value")
            raw[name.strip()] = items  # strings: each check converts its own
    return build_space(raw)


def _parse_range_text(name, text):
    log = text.startswith("log:")
    low, _, high = text[4 if log else 0:].partition("..")
    try:
        return {"log_uniform" if log else "uniform": [float(low), float(high)]}
    except ValueError:
        raise SpaceError(f"{name}: range {text!r} is not LOW..HIGH or log:LOW..HIGH") from None


def load_space(path):
    """A space from a YAML or JSON file: {name: [values...] | value | {uniform|log_uniform: [lo, hi]}}."""
    try:
        raw = read_spec_file(path, "space file")
    except (InvalidArgumentError, NotFoundError) as exc:
        raise SpaceError(str(exc)) from None
    if not isinstance(raw, Mapping) or not raw:
        raise SpaceError(f"space file {path!r} must hold a non-empty mapping of hyperparameter: values")
    return build_space(raw)


def build_space(raw):
    """Check a {name: values} mapping: canonical names, lists of checked values, or Ranges."""
    space = {}
    for name, values in raw.items():
        key = canonical_name(name)
        if key in space:
            raise SpaceError(f"hyperparameter {key!r} is given twice ({name!r} is an alias)")
        if isinstance(values, Mapping):
            space[key] = _range(key, values)
            continue
        # hidden: [64, 128] is two choices; [[128, 64]] is one net with two hidden layers
        items = list(values) if isinstance(values, (list, tuple)) else [values]
        if not items:
            raise SpaceError(f"{key}: no values")
        space[key] = [check_value(key, v) for v in items]
    return space


def _range(name, spec):
    if len(spec) != 1 or next(iter(spec)) not in ("uniform", "log_uniform"):
        raise SpaceError(f"{name}: a range is {{uniform: [lo, hi]}} or {{log_uniform: [lo, hi]}}, got {dict(spec)!r}")
    kind, bounds = next(iter(spec.items()))
    if name not in ("learning_rate", "batch_size", "epochs"):
        raise SpaceError(f"{name}: only learning_rate, batch_size and epochs take a range; list the values")
    if not isinstance(bounds, (list, tuple)) or len(bounds) != 2:
        raise SpaceError(f"{name}: {kind} needs [low, high], got {bounds!r}")
    low, high = (_positive_float(name, b) for b in bounds)
    return Range(name, low, high, log=kind == "log_uniform")


# ------------------------------------------------ points

def complete(point, base):
    """A full point: the defaults, then `base` (the command's --epochs, --batch-size), then the point's own values."""
    return {**DEFAULTS, **(base or {}), **point}


def grid(space, base=None):
    """Every combination, in the order the axes were given (the last axis changes fastest)."""
    ranges = [k for k, v in space.items() if isinstance(v, Range)]
    if ranges:
        raise SpaceError(f"{', '.join(ranges)}: a range can only be sampled; use --random N (or list values)")
    keys = list(space)
    return [complete(dict(zip(keys, combo)), base) for combo in itertools.product(*(space[k] for k in keys))]


def sample(space, n, seed=0, base=None):
    """n points drawn at random (lists as uniform choices, ranges as given): the same for a seed."""
    if not isinstance(n, int) or n < 1:
        raise SpaceError(f"--random needs a positive number of runs, got {n!r}")
    rng = np.random.default_rng(seed)
    points = []
    for _ in range(n):
        point = {}
        for key, values in space.items():
            point[key] = values.draw(rng) if isinstance(values, Range) else values[int(rng.integers(len(values)))]
        points.append(complete(point, base))
    return points


def describe(point, mlp=True):
    """A short label: 'lr=0.01 hidden=128x64 adam bs=100 ep=3 sigmoid' (the MLP's shape only for the MLP)."""
    label = f"lr={point['learning_rate']:.3g} "
    label += f"hidden={'x'.join(map(str, point['hidden']))} " if mlp else ""
    label += f"{point['optimizer']} bs={point['batch_size']} ep={point['epochs']}"
    label += f" {point['activation']}" if mlp else ""
    return label + "".join(f" {k}={v}" for k, v in point.items() if k.startswith(MODEL_PREFIX))
