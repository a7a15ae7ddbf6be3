"""Combining answers: mean, vote, weighted; bad input is InvalidArgumentError."""

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.services.aggregator.combine import combine, same_shape

pytestmark = pytest.mark.unit

A = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]], np.float32)
B = np.array([[0.1, 0.8, 0.1], [0.2, 0.2, 0.6]], np.float32)
C = np.array([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1]], np.float32)


def test_mean_is_the_average_of_the_answers():
    np.testing.assert_allclose(combine("mean", [A, B, C]), (A + B + C) / 3, rtol=1e-6)
    assert combine("mean", [A]).dtype == np.float32


def test_vote_gives_the_share_of_votes_per_class():
    out = combine("vote", [A, B, C])
    np.testing.assert_allclose(out, [[2 / 3, 1 / 3, 0], [1 / 3, 0, 2 / 3]], rtol=1e-6)
    assert out.argmax(axis=1).tolist() == [0, 2]
    np.testing.assert_allclose(combine("vote", [B]), [[0, 1, 0], [0, 0, 1]])


def test_weighted_mean_uses_normalised_weights():
    np.testing.assert_allclose(combine("weighted", [A, B], [3.0, 1.0]), 0.75 * A + 0.25 * B, rtol=1e-6)
    np.testing.assert_allclose(combine("weighted", [A, B], [0.0, 2.0]), B, rtol=1e-6)


def test_bad_combines_are_invalid_argument():
    with pytest.raises(InvalidArgumentError, match="mean, vote, weighted"):
        combine("median", [A])
    with pytest.raises(InvalidArgumentError, match="no member"):
        combine("mean", [])
    with pytest.raises(InvalidArgumentError, match="weight"):
        combine("weighted", [A, B], [0.0, 0.0])
    with pytest.raises(InvalidArgumentError, match="weight"):
        combine("weighted", [A, B], [1.0])


def test_same_shape():
    assert same_shape([A, B]) == (2, 3)
    assert same_shape([A, A[:1]]) is None
