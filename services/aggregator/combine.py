"""Combining the members' probabilities into one answer: mean, majority vote, weighted mean.

Plain numpy, no sockets: the aggregator hands over whatever answers arrived in time.
Every answer must have the same shape [n, classes]; `vote` returns vote shares per class
(each member's argmax counts one), so its output is still a probability-like [n, classes].
"""

import numpy as np

from zmqflow.common.errors import InvalidArgumentError

COMBINERS = ("mean", "vote", "weighted")


def check_combine(name):
    if name not in COMBINERS:
        raise InvalidArgumentError(f"combine must be one of {', '.join(COMBINERS)}, got {name!r:.80}")
    return name


def combine(name, answers, weights=None):
    """One float32 [n, classes] from `answers` (a list of arrays); `weights` (one per answer) for `weighted`."""
    check_combine(name)
    if not answers:
        raise InvalidArgumentError("nothing to combine: no member answered")
    if len(answers) == 1 and name != "vote":
        return np.asarray(answers[0], np.float32)
    stacked = np.stack(answers).astype(np.float32, copy=False)  # [members, n, classes]
    if name == "mean":
        return stacked.mean(axis=0)
    if name == "weighted":
        w = np.asarray(weights if weights is not None else [1.0] * len(answers), np.float32)
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
