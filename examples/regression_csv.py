"""A regression from a CSV: house prices from size, rooms, age and town, with a small network of
zmqflow's layers (`build` below) trained on 1 ps + 2 workers; prints the test RMSE, MAE and R².

    python examples/regression_csv.py
    zmqflow train --data houses.yaml --model examples/regression_csv.py:build     # the same, by hand
"""

import os
import tempfile

import numpy as np

import zmqflow

SPEC = """
files: houses.csv
split: {validation: 0.1, test: 0.2, seed: 1}
features:
  size: numeric
  rooms: numeric
  age: numeric
  town: {type: categorical, vocabulary: [a, b, c, d, e]}
label: {column: price, task: regression}
"""


def build(input_signature, hidden=32):
    """input -> relu(hidden) -> one value, mean squared error (the data gives the input's width)."""
    from zmqflow.models.layer_model import LayerModel
    from zmqflow.models.layers import Dense
    from zmqflow.models.network import Sequential
    (shape, _), = input_signature.values()
    return LayerModel(Sequential([Dense(hidden, activation="relu"), Dense(1)], input_shape=shape), loss="mse", seed=0)


def make_houses_csv(path, rows=8000, seed=0):
    rng = np.random.default_rng(seed)
    size, rooms, age, town = rng.normal(100, 30, rows), rng.integers(1, 7, rows), rng.uniform(0, 60, rows), \
        rng.integers(0, 5, rows)
    price = 2.0 * size / 100 + 0.3 * rooms - 0.01 * age + np.array([0.0, 0.5, 1.0, -0.5, 0.2])[town] + \
        0.1 * np.maximum(size - 120, 0) / 10 + rng.normal(0, 0.1, rows)
    with open(path, "w") as f:
        f.write("size,rooms,age,town,price\n")
        for i in range(rows):
            f.write(f"{size[i]:.1f},{rooms[i]},{age[i]:.1f},{'abcde'[town[i]]},{price[i]:.3f}\n")


def main():
    directory = tempfile.mkdtemp(prefix="houses-")
    make_houses_csv(os.path.join(directory, "houses.csv"))
    with open(os.path.join(directory, "houses.yaml"), "w") as f:
        f.write(SPEC)
    with zmqflow.local_cluster(data=os.path.join(directory, "houses.yaml"), model=f"{__file__}:build", epochs=15,
                               optimizer={"kind": "adam", "learning_rate": 0.005}) as job:
        summary = job.wait()
    test = summary["test_metrics"]
    print(f"regression_csv: test RMSE {test['rmse']:.3f}, MAE {test['mae']:.3f}, R² {test['r2']:.3f} "
          f"(the noise's standard deviation is 0.1)")
    return 0 if test["r2"] > 0.9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
