"""Your own CSV, from Python: a data spec, then one `with zmqflow.local_cluster(...)` block trains an MLP
on 1 ps + 2 workers, validates while training and scores the test split; `zmqflow.serve` then serves the
checkpoint in a model server process that answers raw rows with the class. `main` is the whole of it.

    python examples/tabular_csv.py        # writes a made-up wine CSV to a temporary directory first

The CSV's label is its last column, `grade`; `make_wine_csv` stands in for your file. The same from the
command line:

    zmqflow train --data wine.yaml --model mlp --checkpoint-dir ckpt
    zmqflow serve --checkpoint ckpt
"""

import os
import tempfile

import numpy as np

import zmqflow

SPEC = """
name: wine
files: wine.csv
split: {validation: 0.1, test: 0.2, seed: 0}
features:
  acidity: numeric
  sugar: numeric
  alcohol: {type: numeric, default: 12.0}
  sulphates: numeric
  region: {type: categorical, vocabulary: [north, south, east, west]}
label: {column: grade, task: multiclass}
"""


def make_wine_csv(path, rows=6000, seed=0):
    """Three grades from a noisy score of four measurements and the region; some alcohol fields empty."""
    rng = np.random.default_rng(seed)
    acidity, sugar, alcohol, sulphates = rng.normal(7, 1, rows), rng.gamma(2, 2, rows), rng.normal(12, 1, rows), \
        rng.normal(0.6, 0.1, rows)
    region = rng.integers(0, 4, rows)
    score = 0.8 * (alcohol - 12) - 0.5 * (acidity - 7) + 4 * (sulphates - 0.6) + 0.3 * (region == 1) + \
        rng.normal(0, 0.3, rows)
    grade = np.digitize(score, [-0.5, 0.5])
    with open(path, "w") as f:
        f.write("acidity,sugar,alcohol,sulphates,region,grade\n")
        for i in range(rows):
            alc = "" if i % 50 == 0 else f"{alcohol[i]:.2f}"     # an empty field takes the spec's default
            f.write(f"{acidity[i]:.2f},{sugar[i]:.2f},{alc},{sulphates[i]:.3f},"
                    f"{['north', 'south', 'east', 'west'][region[i]]},{['low', 'mid', 'high'][grade[i]]}\n")


def main():
    directory = tempfile.mkdtemp(prefix="wine-")
    make_wine_csv(os.path.join(directory, "wine.csv"))
    with open(os.path.join(directory, "wine.yaml"), "w") as f:
        f.write(SPEC)
    checkpoint = os.path.join(directory, "ckpt")
    with zmqflow.local_cluster(num_ps=1, num_workers=2, data=os.path.join(directory, "wine.yaml"), model="mlp",
                               model_options={"activation": "relu"}, epochs=20, validate_every_steps=200,
                               optimizer={"kind": "adam", "learning_rate": 0.01}, checkpoint_dir=checkpoint) as job:
        summary = job.wait()
    test = summary["test_metrics"]
    print(f"tabular_csv: test accuracy {test['accuracy']:.3f}, macro-F1 {test['macro_f1']:.3f} "
          f"(best validation accuracy {summary['best_validation']['accuracy']:.3f} at step "
          f"{summary['best_validation']['step']}; {summary['examples_per_s']:,} examples/s)")
    with zmqflow.serve(checkpoint) as model:               # a model server process, stopped after the block
        _, answer = model.predict_records({"acidity": [6.0, 8.5], "sugar": [3.1, 4.0], "alcohol": [13.8, 10.6],
                                           "sulphates": [0.78, 0.45], "region": ["south", "west"]})
    print(f"tabular_csv: served at {model.endpoint}, two new wines graded {answer['predicted']}")
    return 0 if test["accuracy"] > 0.75 and answer["predicted"] == ["high", "low"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
