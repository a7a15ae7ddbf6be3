"""A multi-label task from a CSV: which of three tags (outdoor, family, budget) a trip has, from four
numbers and a season; sigmoid cross-entropy over three outputs, trained on 1 ps + 2 workers.

    python examples/multi_label.py
"""

import os
import tempfile

import numpy as np

import zmqflow

SPEC = """
files: trips.csv
split: {test: 0.2, seed: 0}
features:
  days: numeric
  price: numeric
  kids: numeric
  rain: numeric
  season: {type: categorical, vocabulary: [winter, spring, summer, autumn]}
label: {columns: [outdoor, family, budget], task: multi_label}
"""


def build(input_signature, outputs, hidden=32):
    """input -> relu(hidden) -> one logit per tag; each tag is its own yes/no (sigmoid cross-entropy)."""
    from zmqflow.models.layer_model import LayerModel
    from zmqflow.models.layers import Dense
    from zmqflow.models.network import Sequential
    (shape, _), = input_signature.values()
    return LayerModel(Sequential([Dense(hidden, activation="relu"), Dense(outputs)], input_shape=shape),
                      loss="sigmoid_cross_entropy", seed=0)


def make_trips_csv(path, rows=6000, seed=0):
    rng = np.random.default_rng(seed)
    days, price, kids, rain = rng.integers(1, 15, rows), rng.uniform(100, 3000, rows), rng.integers(0, 4, rows), \
        rng.uniform(0, 1, rows)
    season = rng.integers(0, 4, rows)
    outdoor = (rain < 0.5) & (season != 0)
    family = kids > 0
    budget = price / days < 150
    with open(path, "w") as f:
        f.write("days,price,kids,rain,season,outdoor,family,budget\n")
        for i in range(rows):
            f.write(f"{days[i]},{price[i]:.0f},{kids[i]},{rain[i]:.2f},"
                    f"{['winter', 'spring', 'summer', 'autumn'][season[i]]},"
                    f"{int(outdoor[i])},{int(family[i])},{int(budget[i])}\n")


def main():
    directory = tempfile.mkdtemp(prefix="trips-")
    make_trips_csv(os.path.join(directory, "trips.csv"))
    with open(os.path.join(directory, "trips.yaml"), "w") as f:
        f.write(SPEC)
    with zmqflow.local_cluster(data=os.path.join(directory, "trips.yaml"), model=f"{__file__}:build", epochs=20,
                               optimizer={"kind": "adam", "learning_rate": 0.01}) as job:
        summary = job.wait()
    test = summary["test_metrics"]
    print(f"multi_label: per-tag test accuracy {test['accuracy']:.3f}, log-loss {test['log_loss']:.3f}")
    return 0 if test["accuracy"] > 0.85 else 1


if __name__ == "__main__":
    raise SystemExit(main())
