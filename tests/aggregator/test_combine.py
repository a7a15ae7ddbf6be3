"""Combining answers: mean, vote, weighted; bad input is InvalidArgumentError."""

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.combine import CustomCombine, combine, same_shape

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
    with pytest.raises(InvalidArgumentError, match="mean, vote, weighted, median"):
        combine("mode", [A])
    with pytest.raises(InvalidArgumentError, match="no member"):
        combine("mean", [])
    with pytest.raises(InvalidArgumentError, match="weight"):
        combine("weighted", [A, B], [0.0, 0.0])
    with pytest.raises(InvalidArgumentError, match="weight"):
        combine("weighted", [A, B], [1.0])


def test_same_shape():
    assert same_shape([A, B]) == (2, 3)
    assert same_shape([A, A[:1]]) is None


R1, R2, R3 = (np.array([[1.0], [4.0]], np.float32), np.array([[2.0], [5.0]], np.float32),
              np.array([[9.0], [5.5]], np.float32))


def test_a_regression_is_combined_by_mean_or_median_and_vote_is_refused():
    np.testing.assert_allclose(combine("mean", [R1, R2, R3]), [[4.0], [14.5 / 3]], rtol=1e-6)
    np.testing.assert_allclose(combine("median", [R1, R2, R3]), [[2.0], [5.0]])
    with pytest.raises(InvalidArgumentError, match=r"vote needs class probabilities; these answers have one output "
                                                   r"\(a regression\)"):
        combine("vote", [R1, R2])


def test_a_function_of_the_users_combines_with_the_weights(tmp_path):
    (tmp_path / "mine.py").write_text("import numpy as np\n"
                                      "def most_sure(answers, weights):\n"
                                      "    return np.max(np.stack(answers), axis=0) * weights[0]\n"
                                      "def wrong(answers, weights):\n"
                                      "    return answers[0][:1]\n")
    custom = CustomCombine(f"{tmp_path}/mine.py:most_sure")
    np.testing.assert_allclose(combine(custom.name, [A, B], [2.0, 1.0], custom), np.maximum(A, B) * 2)
    with pytest.raises(InvalidArgumentError, match=r"must return an array \[2, outputs\], got \[1, 3\]"):
        wrong = CustomCombine(f"{tmp_path}/mine.py:wrong")
        combine(wrong.name, [A], None, wrong)
    with pytest.raises(InvalidArgumentError, match="has no function 'absent'"):
        CustomCombine(f"{tmp_path}/mine.py:absent")
    with pytest.raises(InvalidArgumentError, match="FILE.py:FUNCTION or MODULE:FUNCTION"):
        CustomCombine("no-colon")
    custom = CustomCombine("numpy:maximum")   # a module's function: maximum(answers, weights) is not one
    with pytest.raises(InvalidArgumentError, match="combine function numpy:maximum failed"):
        combine(custom.name, [A, B], [1.0, 1.0], custom)
