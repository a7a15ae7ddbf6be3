"""A large embedding table split over two ps shards, trained by two workers that pull only the rows
their batch reads and push only those rows' gradients (IndexedSlices); the ps updates them with lazy
Adam, which moves only the touched rows and their slot rows.

    python examples/sparse_embedding.py            # sparse rows (the default for an Embedding on an input)
    python examples/sparse_embedding.py --dense    # the same job pulling and pushing the whole table
    python examples/sparse_embedding.py --epochs 1 # a shorter run (RMSE about 0.3 instead of 0.2)

A made-up ratings set (user, item -> rating) in .npz files, described by a data spec whose user and
item ids are categorical features (`encode: ids`), trained as a `zmqflow.local_cluster` job (a broker,
2 ps shards, 2 workers; the rows fed from memory); prints the test RMSE and the bytes the ps sent per
step against the tables'. The model is `build` below: the workers and shards import this file.
"""

import argparse
import tempfile

import numpy as np

import zmqflow
from zmqflow.common.errors import OpError
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Concatenate, Dense, Embedding, Flatten, Input
from zmqflow.models.network import Network

USERS, ITEMS, DIM = 20_000, 500, 16


def build(input_signature, sparse=True):
    """user and item ids -> one embedding each -> a small MLP -> the rating (mean squared error)."""
    user, item = Input((1,), dtype="int64", name="user"), Input((1,), dtype="int64", name="item")
    users = Flatten()(Embedding(USERS + 1, DIM, sparse=sparse, name="users")(user))   # + 1: the unknown id
    items = Flatten()(Embedding(ITEMS + 1, DIM, sparse=sparse, name="items")(item))
    hidden = Dense(32, activation="relu")(Concatenate()([users, items]))
    return LayerModel(Network([user, item], Dense(1)(hidden)), loss="mse", seed=0)


def ratings(path, n, seed=0):
    """A user's taste plus an item's quality plus noise (0.1): what the embeddings have to learn."""
    rng = np.random.default_rng(seed)
    taste, quality = np.random.default_rng(42).standard_normal((2, max(USERS, ITEMS)))
    user, item = rng.integers(0, USERS, n), rng.integers(0, ITEMS, n)
    rating = taste[user] + quality[item] + 0.1 * rng.standard_normal(n)
    np.savez(path, user=user, item=item, rating=rating.astype(np.float32))
    return rating


def main(dense=False, examples=200_000, epochs=3):
    directory = tempfile.mkdtemp(prefix="sparse-embedding-")
    ratings(f"{directory}/train.npz", examples)
    test_std = ratings(f"{directory}/test.npz", 20_000, seed=1).std()
    data = {"source": {"format": "npz"}, "files": {"train": f"{directory}/train.npz", "test": f"{directory}/test.npz"},
            "features": {"user": {"type": "categorical", "vocabulary": list(range(USERS)), "encode": "ids"},
                         "item": {"type": "categorical", "vocabulary": list(range(ITEMS)), "encode": "ids"}},
            "label": {"column": "rating", "task": "regression"}}
    stats = None
    with zmqflow.local_cluster(num_ps=2, num_workers=2, data=data, model={"type": f"{__file__}:build", "sparse": not dense},
                               epochs=epochs, optimizer={"kind": "adam", "learning_rate": 0.01, "lazy": True},
                               max_shard_bytes=USERS * DIM * 4 // 2, log_dir=directory) as job:   # half a table a shard
        for _ in job.metrics(interval=1.0):
            try:   # the ps shards' counters while they run (the chief stops them at the end)
                stats = [job.ps_stats(i) for i in range(2)]
            except OpError:
                pass
        summary = job.wait()
    rmse = summary["test_metrics"]["rmse"]
    steps, sent = stats[0]["version"], sum(s["bytes_pulled"] for s in stats)
    table = (USERS + 1 + ITEMS + 1) * DIM * 4
    print(f"sparse_embedding ({'dense' if dense else 'sparse'} tables): test RMSE {rmse:.3f} (ratings' standard "
          f"deviation {test_std:.2f}); {summary['global_step']} steps, the ps sent {sent / steps / 1024:.1f} KiB per "
          f"step for tables of {table / 1024:.0f} KiB")
    return 0 if rmse < 0.5 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Train the sparse embedding model on made-up ratings.")
    parser.add_argument("--dense", action="store_true", help="pull and push the whole tables every step")
    parser.add_argument("--epochs", type=int, default=3, help="epochs over the 200,000 training ratings")
    options = parser.parse_args()
    raise SystemExit(main(dense=options.dense, epochs=options.epochs))
