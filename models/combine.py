"""Combining the members' answers into one: by the task, or by a function of the user's.

Plain numpy, no sockets: the aggregator hands over whatever answers arrived in time, an ensemble
server (services/serve/ensemble.py) those of the checkpoints it hosts; both combine here, so the
two answer alike. Every answer has the same shape [n, outputs]:
  mean      class probabilities (classifiers, multi-label) or values (a regression) averaged
  weighted  the same with each member's weight
  median    per output: robust to one member far off (a regression's natural choice)
  vote      majority vote: each member's argmax counts one; vote shares per class, so the output
            is still probability-like [n, classes]; refused for one-output answers (a regression)
  FILE.py:FUNCTION or MODULE:FUNCTION   `function(answers, weights) -> [n, outputs]`, where answers
            is a list of float32 arrays [n, outputs] (those that arrived) and weights their weights
"""

import importlib

import numpy as np

from zmqflow.common.errors import InvalidArgumentError

COMBINERS = ("mean", "vote", "weighted", "median")


def check_combine(name, custom=None):
    """`name` if it is a built-in combine or the aggregator's own function (`custom`)."""
    if name not in COMBINERS and (custom is None or name != custom.name):
        known = ", ".join(COMBINERS + ((custom.name,) if custom is not None else ()))
        raise InvalidArgumentError(f"combine must be one of {known}, got {name!r:.80}")
    return name


class CustomCombine:
    """A user's combine function, loaded once by its reference (`path.py:function` or `module:function`)."""

    def __init__(self, reference):
        self.name = reference
        location, sep, function = reference.rpartition(":")
        if not sep or not location or not function:
            raise InvalidArgumentError(f"a combine function is FILE.py:FUNCTION or MODULE:FUNCTION, got {reference!r}")
        if location.endswith(".py"):
            from zmqflow.models.user_file import load_function
            self.function = load_function(location, function, what="combine function file")
        else:
            try:
                self.function = getattr(importlib.import_module(location), function)
            except (ImportError, AttributeError) as exc:
                raise InvalidArgumentError(f"combine function {reference!r} cannot be loaded: {exc}") from None
        if not callable(self.function):
            raise InvalidArgumentError(f"combine function {reference!r} is not callable")

    def __call__(self, answers, weights):
        try:
            out = self.function(answers, weights)
        except Exception as exc:
            raise InvalidArgumentError(f"combine function {self.name} failed: {type(exc).__name__}: {exc}") from exc
        out = np.asarray(out, dtype=np.float32) if out is not None else None
        if out is None or out.ndim != 2 or len(out) != len(answers[0]):
            raise InvalidArgumentError(f"combine function {self.name} must return an array [{len(answers[0])}, "
                                       f"outputs], got {None if out is None else list(out.shape)}")
        return out


def combine(name, answers, weights=None, custom=None):
    """One float32 [n, outputs] from `answers` (a list of arrays); `weights` (one per answer) for
    `weighted` and for a custom function."""
    check_combine(name, custom)
    if not answers:
        raise InvalidArgumentError("nothing to combine: no member answered")
    weights = list(weights) if weights is not None else [1.0] * len(answers)
    if custom is not None and name == custom.name:
        return custom([np.asarray(a, np.float32) for a in answers], weights)
    if name == "vote" and np.shape(answers[0])[-1] == 1:
        raise InvalidArgumentError("vote needs class probabilities; these answers have one output (a regression): "
                                   "combine with mean, median or a function of your own")
    if len(answers) == 1 and name != "vote":
        return np.asarray(answers[0], np.float32)
    stacked = np.stack(answers).astype(np.float32, copy=False)  # [members, n, outputs]
    if name == "mean":
        return stacked.mean(axis=0)
    if name == "median":
        return np.median(stacked, axis=0).astype(np.float32, copy=False)
    if name == "weighted":
        w = np.asarray(weights, np.float32)
        if w.shape != (len(answers),) or np.any(w < 0) or not w.sum() > 0:
            raise InvalidArgumentError(f"weighted combine needs one non-negative weight per answer, sum > 0; got {w}")
        return np.tensordot(w / w.sum(), stacked, axes=1).astype(np.float32, copy=False)
    classes = stacked.shape[2]
    votes = np.argmax(stacked, axis=2)  # [members, n]
    counts = np.zeros(stacked.shape[1:], np.float32)
    for member_votes in votes:
        counts[np.arange(len(member_votes)), member_votes] += 1.0
    return counts / np.float32(len(answers)) if classes else counts


def same_shape(answers):
    """The shape every answer shares, or None when they disagree."""
    shapes = {np.shape(a) for a in answers}
    return shapes.pop() if len(shapes) == 1 else None


def combine_answers(name, answers, weights=None, custom=None):
    """One float32 [n, outputs] from {member: answer} (`weights` {member: weight}); answers of different
    shapes are an error naming each member's."""
    if same_shape(list(answers.values())) is None:
        raise InvalidArgumentError("members answered with different shapes: " + ", ".join(
            f"{who} {list(np.shape(answer))}" for who, answer in answers.items()))
    return combine(name, list(answers.values()), None if weights is None else [weights[who] for who in answers],
                   custom)
