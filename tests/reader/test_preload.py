"""Preloading: a small data set loaded once, sliced into batches over epochs, handed to a hook."""

import numpy as np
import pytest

from zmqflow.common.errors import ResourceExhaustedError
from zmqflow.services.reader.cli import PRESETS
from zmqflow.services.reader.preload import load_dataset, preload, slice_indices
from tests.reader import mnist_csv

pytestmark = pytest.mark.unit

FIXED = PRESETS["mnist-fixed"]


def test_load_gives_the_rows_of_the_csv():
    data = load_dataset(FIXED["files"], FIXED["format"], FIXED["options"], features=["image", "label"],
                        cast=FIXED["cast"])
    pixels, labels = mnist_csv()
    assert data.size == 100 and data["label"].dtype == np.int32
    np.testing.assert_array_equal(data["label"], labels[:100])
    np.testing.assert_allclose(data["image"], pixels[:100] / 255, atol=1e-6)


def test_batches_cover_every_epoch_and_reshuffle():
    batches = list(slice_indices(10, 4, num_epochs=2, shuffle=True, seed=0))
    assert [len(b) for b in batches] == [4, 4, 4, 4, 4]
    flat = np.concatenate(batches)
    assert sorted(flat[:10].tolist()) == list(range(10)) and sorted(flat[10:].tolist()) == list(range(10))
    assert flat[:10].tolist() != flat[10:].tolist()
    assert [len(b) for b in slice_indices(10, 4, 1, False, allow_smaller_final_batch=False)] == [4, 4]


def test_the_hook_gets_every_feature_and_big_data_is_refused():
    data = load_dataset(FIXED["files"], FIXED["format"], FIXED["options"])
    seen = {}
    assert preload(data, lambda name, values: seen.update({name: values.shape})) == ["label", "image"]
    assert seen == {"label": (100,), "image": (100, 784)}
    assert next(data.batches(30, shuffle=False))["label"].shape == (30,)
    with pytest.raises(ResourceExhaustedError, match="preloading is for small"):
        load_dataset(FIXED["files"], FIXED["format"], FIXED["options"], max_bytes=1000)
