"""A large embedding table split over two ps shards, trained by two workers that pull only the rows
their batch reads and push only those rows' gradients (IndexedSlices); the ps updates them with lazy
Adam, which moves only the touched rows and their slot rows.

    python examples/sparse_embedding.py            # sparse rows (the default for an Embedding on an input)
    python examples/sparse_embedding.py --dense    # the same job pulling and pushing the whole table

Starts a broker, 2 ps shards and 2 workers as processes (`zmqflow broker | ps | worker`), feeds a
made-up ratings set (user, item -> rating) into the workers' queue from this script, as a
QueueRunner would, and prints the test RMSE and the bytes the ps sent per step against the table's.
The model is `build` below: the workers and shards import this file (`--model`).
"""

import json
import sys
import tempfile

import numpy as np

from zmqflow.common.placement import place
from zmqflow.common.ps_client import PsClient, PsShardClient
from zmqflow.common.queues import RandomShuffleQueue
from zmqflow.common.supervisor import Supervisor
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Concatenate, Dense, Embedding, Flatten, Input
from zmqflow.models.network import Network
from zmqflow.models.registry import load_model

USERS, ITEMS, DIM = 20_000, 500, 16
SIGNATURE = {"user": [[1], "int64"], "item": [[1], "int64"]}


def build(input_signature, sparse=True):
    """user and item ids -> one embedding each -> a small MLP -> the rating (mean squared error)."""
    user, item = Input((1,), dtype="int64", name="user"), Input((1,), dtype="int64", name="item")
    users = Flatten()(Embedding(USERS, DIM, sparse=sparse, name="users")(user))
    items = Flatten()(Embedding(ITEMS, DIM, sparse=sparse, name="items")(item))
    hidden = Dense(32, activation="relu")(Concatenate()([users, items]))
    return LayerModel(Network([user, item], Dense(1)(hidden)), loss="mse", seed=0)


def ratings(n, seed=0):
    """A user's taste plus an item's quality plus noise (0.1): what the embeddings have to learn."""
    rng = np.random.default_rng(seed)
    taste, quality = np.random.default_rng(42).standard_normal((2, max(USERS, ITEMS)))
    user, item = rng.integers(0, USERS, n), rng.integers(0, ITEMS, n)
    rating = taste[user] + quality[item] + 0.1 * rng.standard_normal(n)
    return {"user": user[:, None], "item": item[:, None], "label": rating.astype(np.float32)}


def main(dense=False, examples=200_000, epochs=3):
    spec = {"type": f"{__file__}:build", "input_signature": SIGNATURE, "sparse": not dense}
    options = ["--model", json.dumps(spec), "--max-shard-bytes", str(USERS * DIM * 4 // 2)]  # half a table per shard
    optimizer = json.dumps({"kind": "adam", "learning_rate": 0.01, "lazy": True})
    with Supervisor(log_dir=tempfile.mkdtemp(prefix="sparse-embedding-")) as job:
        broker = job.start_service("zmqflow.services.broker").endpoint
        shards = [job.start_service("zmqflow.services.ps", ["--task-index", str(i), "--num-ps", "2",
                                                            "--optimizer", optimizer, *options]) for i in range(2)]
        ps_flags = [flag for shard in shards for flag in ("--ps", shard.endpoint)]
        queue = RandomShuffleQueue(20_000, 2_000, ["int64", "int64", "float32"], [[1], [1], []],
                                   names=["user", "item", "label"], shared_name="train", broker=broker, seed=0)
        workers = [job.start_process("zmqflow.services.worker", ["--broker", broker, *ps_flags, "--task-index", str(i),
                                                                 "--num-workers", "2", *options]) for i in range(2)]
        data = ratings(examples)
        for _ in range(epochs):
            for start in range(0, examples, 5_000):
                queue.enqueue_many({k: v[start:start + 5_000] for k, v in data.items()}, timeout=600)
        queue.close()
        exits = [worker.proc.wait(600) for worker in workers]
        if exits != [0, 0]:
            print(f"workers exited {exits}; their logs are in {job.log_dir}", file=sys.stderr)
            return 1
        stats = [PsShardClient(shard.endpoint).stats() for shard in shards]
        model = load_model(spec)
        ps = PsClient([s.endpoint for s in shards], place(model.variables(), 2, max_shard_bytes=USERS * DIM * 2))
        params = ps.pull()
        ps.close()
    test = ratings(20_000, seed=1)
    rmse = float(np.sqrt(np.mean((model.predict(params, test)[:, 0] - test["label"]) ** 2)))
    steps, sent = stats[0]["version"], sum(s["bytes_pulled"] for s in stats)
    table = params["users/embeddings"].nbytes + params["items/embeddings"].nbytes
    print(f"sparse_embedding ({'dense' if dense else 'sparse'} tables): test RMSE {rmse:.3f} (ratings' standard "
          f"deviation {test['label'].std():.2f}); {steps} steps, the ps sent {sent / steps / 1024:.1f} KiB per step "
          f"for tables of {table / 1024:.0f} KiB")
    return 0 if rmse < 0.5 else 1


if __name__ == "__main__":
    raise SystemExit(main(dense="--dense" in sys.argv))
