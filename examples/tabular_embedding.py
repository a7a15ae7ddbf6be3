"""A functional model with two inputs: numeric columns and a categorical column through an Embedding,
concatenated, on a made-up regression task; trained here in one process with plain SGD, to show the
layer library and the model protocol on their own (step -> loss, gradients, metrics).

    python examples/tabular_embedding.py      # prints the test RMSE (the noise's is 0.1)
"""

import numpy as np

from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Concatenate, Dense, Embedding, Flatten, Input
from zmqflow.models.network import Network

CITIES = 50


def make_data(n, rng, city_effect):
    numeric = rng.standard_normal((n, 3)).astype(np.float32)
    city = rng.integers(0, CITIES, (n, 1))
    y = numeric @ np.array([1.0, -2.0, 0.5]) + city_effect[city[:, 0]] + 0.1 * rng.standard_normal(n)
    return {"numeric": numeric, "city": city}, y.astype(np.float32)


def build_model():
    numeric, city = Input((3,), name="numeric"), Input((1,), dtype="int64", name="city")
    embedded = Flatten()(Embedding(CITIES, 4)(city))
    hidden = Dense(32, activation="relu")(Concatenate()([numeric, embedded]))
    return LayerModel(Network([numeric, city], Dense(1)(hidden)), loss="mse", seed=0)


def main():
    rng = np.random.default_rng(0)
    city_effect = rng.standard_normal(CITIES) * 2
    model = build_model()
    print(model.network.summary())
    params = model.initial_values()
    for step in range(1500):
        x, y = make_data(64, rng, city_effect)
        loss, grads, _ = model.step(params, (x, y))
        for name, g in grads.items():
            params[name] -= 0.05 * g
    x, y = make_data(2000, rng, city_effect)
    rmse = float(np.sqrt(np.mean((model.predict(params, x)[:, 0] - y) ** 2)))
    print(f"tabular_embedding: test RMSE {rmse:.3f} (the target's standard deviation: {y.std():.2f})")
    return 0 if rmse < 0.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
