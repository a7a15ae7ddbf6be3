"""Preloading: a small data set read once into memory and sliced, instead of streamed through queues.

TensorFlow's "preloaded data" put a data set that fits in memory into a
non-trainable variable and let slice_input_producer cut it into instances.
Here the loading and the slicing happen in one process, and `preload_to_ps`
puts the arrays on a ps shard (its `preload` op: held once, never trained),
where workers slice them by row (`zmqflow worker --preloaded NAME`,
services/worker/preloaded_input.py):

    data = load_dataset("data/mnist_5k.csv.gz", "csv", options, features=["image", "label"])
    data.size, data["label"]                     # 5000, int32 [5000]
    for b in data.batches(100, num_epochs=1, shuffle=True, seed=0):   # like slice_input_producer + batch
        ...
    preload_to_ps(data, "tcp://ps0:5600", "train")   # then: zmqflow worker --preloaded train ...
    preload(data, target)                        # or any target(name, array) per feature

Loading reads every file with a format (formats/), so the instances are the same
as the reader pipeline's; it refuses more than `max_bytes` (ResourceExhausted),
because a data set that does not fit belongs in a queue.
"""

import numpy as np

from zmqflow.common.errors import InvalidArgumentError, ResourceExhaustedError
from zmqflow.inputs.formats import open_format
from zmqflow.services.reader.producer import expand_globs

DEFAULT_MAX_BYTES = 1 << 30


class PreloadedData:
    """Arrays of one data set, feature name -> [size, ...], all with the same first dimension."""

    def __init__(self, features):
        sizes = {len(v) for v in features.values()}
        if len(sizes) != 1:
            raise InvalidArgumentError(f"features have different lengths: { {k: len(v) for k, v in features.items()} }")
        self.features = features
        self.size = sizes.pop()

    def __getitem__(self, name):
        return self.features[name]

    @property
    def nbytes(self):
        return sum(v.nbytes for v in self.features.values())

    def take(self, indices):
        """The instances at `indices` (an int array or a slice), as {name: array}."""
        return {name: values[indices] for name, values in self.features.items()}

    def batches(self, batch_size, num_epochs=1, shuffle=True, seed=None, allow_smaller_final_batch=True):
        """Batches of `batch_size` over `num_epochs` passes (None: forever), each pass reshuffled when
        `shuffle`; the last short batch of all is kept unless allow_smaller_final_batch is False."""
        for indices in slice_indices(self.size, batch_size, num_epochs, shuffle, seed, allow_smaller_final_batch):
            yield self.take(indices)


def slice_indices(size, batch_size, num_epochs=1, shuffle=True, seed=None, allow_smaller_final_batch=True):
    """Index arrays of batches over `num_epochs` passes of range(size); batches run across epoch ends, as a
    queue fed by slice_input_producer would give them."""
    if batch_size < 1 or size < 1:
        raise InvalidArgumentError("batch_size and the data set's size must be >= 1")
    rng = np.random.default_rng(seed)
    epoch, carry = 0, np.empty(0, dtype=np.int64)
    while num_epochs is None or epoch < num_epochs:
        order = rng.permutation(size) if shuffle else np.arange(size)
        carry = np.concatenate([carry, order])
        while len(carry) >= batch_size:
            yield carry[:batch_size]
            carry = carry[batch_size:]
        epoch += 1
    if len(carry) and allow_smaller_final_batch:
        yield carry


def load_dataset(patterns, format_kind, format_options=None, features=None, cast=None, max_bytes=DEFAULT_MAX_BYTES):
    """Every instance of the files matched by `patterns`, in file order, as PreloadedData."""
    fmt = open_format(format_kind, **dict(format_options or {}))
    names = list(fmt.spec) if features is None else list(features)
    parts, total = {name: [] for name in names}, 0
    for path in expand_globs(patterns):
        for chunk in fmt.read(path):
            for name in names:
                values = chunk.features[name]
                if cast and name in cast:
                    values = values.astype(cast[name], copy=False)
                parts[name].append(values)
                total += values.nbytes
            if total > max_bytes:
                raise ResourceExhaustedError(f"{patterns}: more than {max_bytes} bytes; preloading is for small data "
                                             "sets, stream larger ones through the reader pipeline")
    return PreloadedData({name: np.concatenate(chunks) if chunks else np.empty(0) for name, chunks in parts.items()})


def preload(data, target):
    """Hand each feature of `data` to `target(name, array)`: the hook a ps-side store will implement
    (for instance one that creates a non-trainable variable per feature). Returns the feature names."""
    for name, values in data.features.items():
        target(name, values)
    return list(data.features)


def preload_to_ps(data, ps_endpoint, name, timeout=60.0):
    """Hold `data` on the ps shard at `ps_endpoint` as the preloaded data set `name`."""
    from zmqflow.common.clients.ps import PsShardClient
    with PsShardClient(ps_endpoint) as client:
        return client.preload(name, data.features, timeout=timeout)
