"""In-graph replication inside one worker (`--towers N`), TensorFlow's multi-GPU recipe: each
tower computes the loss and gradients of its slice of the batch on its own device, and the
worker averages them before its one push per step.

Towers run on threads: CuPy launches asynchronously and numpy's BLAS releases the GIL, so N
towers overlap on N GPUs or N cores (the numba elementwise kernels hold the GIL; they are the
small part of a step). With CPU towers, give BLAS one thread per tower so they fit the cores.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from zmqflow.common.errors import InvalidArgumentError, check_int


def tower_devices(n, num_gpus):
    """Tower i on GPU i (round robin when towers outnumber GPUs); all on the CPU without a GPU."""
    check_int("towers", n, 1)
    return [f"/gpu:{i % num_gpus}" for i in range(n)] if num_gpus else ["/cpu:0"] * n


def split_sizes(batch, towers):
    """Contiguous slice sizes, the first ones one larger when the batch does not divide (np.array_split)."""
    return [batch // towers + (i < batch % towers) for i in range(towers)]


class TowerModel:
    """The model protocol over towers. `model_factory(device)` builds one tower's model and is
    called once per device, in order: every tower needs its own, as kernels reuse scratch buffers.
    `towers` is a list of device strings (tower_devices(n, visible_gpu_count()) spreads n over the GPUs).

    The result equals one model on the whole batch: the loss and gradients of each slice are
    means over the slice, so they are averaged with the slice sizes as weights."""

    def __init__(self, model_factory, towers):
        self.devices = list(towers)
        if not self.devices:
            raise InvalidArgumentError("a TowerModel needs at least one tower")
        self.towers = [model_factory(device) for device in self.devices]
        self._pool = ThreadPoolExecutor(len(self.towers), "tower") if len(self.towers) > 1 else None

    def variables(self):
        return self.towers[0].variables()

    def initial_values(self, seed=None):
        return self.towers[0].initial_values(seed)

    def step(self, params, batch):
        x, y = batch
        results, sizes = self._map(lambda tower, xs, ys: tower.step(params, (xs, ys)), x, y)
        if len(results) == 1:
            return results[0]
        weights = [n / sum(sizes) for n in sizes]
        loss, grads, metrics = (weighted_average([result[i] for result in results], weights) for i in range(3))
        return float(loss), grads, metrics

    def predict(self, params, x):
        results, _ = self._map(lambda tower, xs, _: tower.predict(params, xs), x, None)
        return results[0] if len(results) == 1 else np.concatenate(results)

    def _map(self, fn, x, y):
        """fn(tower, x slice, y slice) on every tower at once: ([results], [slice sizes])."""
        batch = x.shape[0] if getattr(x, "ndim", 0) >= 1 else 0
        used = min(len(self.towers), batch)
        if used <= 1:  # one tower, or a batch that tower 0 will reject with the model's own error
            return [fn(self.towers[0], x, y)], [max(batch, 1)]
        sizes, futures, start = split_sizes(batch, used), [], 0
        for tower, n in zip(self.towers, sizes):
            part = slice(start, start + n)
            futures.append(self._pool.submit(fn, tower, x[part], None if y is None else y[part]))
            start += n
        return [f.result() for f in futures], sizes

    def close(self):
        """Stop the tower threads."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def weighted_average(values, weights):
    """Results averaged with `weights` (each part's rows over the whole batch's): numbers and arrays, or dicts
    of them. The towers' here; the replicas' of an in-graph sync step too (in_graph.py)."""
    if isinstance(values[0], dict):
        return {key: weighted_average([v[key] for v in values], weights) for key in values[0]}
    return sum(v * w for v, w in zip(values, weights))
