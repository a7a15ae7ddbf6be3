"""A notebook, as a script: your CSV to a trained, evaluated model and its predictions, with
`zmqflow.local_cluster` (1 ps + 2 workers as processes) and the job's metrics streamed while it trains.

    python examples/local_cluster_notebook.py      # each `# %%` is a cell (VS Code, Jupytext, Spyder)

The CSV is made up here (a coffee shop's orders: will the customer come back?); put yours in its place.
"""

# %% A CSV and its data spec (docs/data.md): the label is the last column
import os
import tempfile

import numpy as np

import zmqflow
from zmqflow.jobs.evaluate import evaluate_checkpoint, labelled_split
from zmqflow.jobs.predict import predict_file

work = tempfile.mkdtemp(prefix="notebook-")
rng = np.random.default_rng(7)
rows = 3000
visits, spend, distance = rng.poisson(4, rows), rng.gamma(2.0, 6.0, rows), rng.exponential(3.0, rows)
drink = rng.choice(["espresso", "latte", "tea"], rows)
score = 0.5 * visits + 0.08 * spend - 0.6 * distance + 0.8 * (drink == "espresso") + rng.normal(0, 0.7, rows)
returns = np.where(score > np.median(score), "yes", "no")
with open(os.path.join(work, "orders.csv"), "w") as f:
    f.write("visits,spend,distance,drink,returns\n")
    f.writelines(f"{v},{s:.2f},{d:.2f},{k},{r}\n" for v, s, d, k, r in zip(visits, spend, distance, drink, returns))
with open(os.path.join(work, "orders.yaml"), "w") as f:
    f.write("""
files: orders.csv
split: {validation: 0.1, test: 0.2, seed: 0}
features:
  visits: numeric
  spend: numeric
  distance: numeric
  drink: {type: categorical, vocabulary: [espresso, latte, tea]}
label: {column: returns, task: binary}
""")

# %% Train on 1 ps + 2 workers; the metrics stream while the job runs
checkpoint = os.path.join(work, "ckpt")
with zmqflow.local_cluster(num_ps=1, num_workers=2, data=os.path.join(work, "orders.yaml"), model="mlp", epochs=30,
                           checkpoint_dir=checkpoint, validate_every_steps=100,
                           optimizer={"kind": "adam", "learning_rate": 0.01}) as job:
    shown = -1
    for point in job.metrics(interval=0.5):
        if point["global_step"] // 100 > shown // 100 or not point["running"]:   # a line per 100 steps
            shown = point["global_step"]
            loss = "-" if point["loss"] is None else f"{point['loss']:.4f}"
            accuracy = "-" if point["validation"] is None else f"{point['validation']['accuracy']:.3f}"
            print(f"step {point['global_step']:5d}  {point['examples_per_s']:9,.0f} examples/s  loss {loss}  "
                  f"validation accuracy {accuracy}")
    summary = job.wait()

# %% Evaluate: the final checkpoint on the test split, and the best validated one
spec, test = labelled_split(os.path.join(work, "orders.yaml"), "test")
final = evaluate_checkpoint(checkpoint, test.x, test.y, task="binary")["metrics"]
best = evaluate_checkpoint(os.path.join(checkpoint, "best"), test.x, test.y, task="binary")["metrics"]
print(f"test: final accuracy {final['accuracy']:.3f} (AUC {final['auc']:.3f}); "
      f"best validated (step {summary['best_validation']['step']}) accuracy {best['accuracy']:.3f}")

# %% Predict a few new rows (no label column): the class and each class's probability
with open(os.path.join(work, "new.csv"), "w") as f:
    f.write("visits,spend,distance,drink\n9,40.00,0.50,espresso\n1,3.50,12.00,tea\n4,12.00,2.50,latte\n")
columns, predictions = predict_file(checkpoint, os.path.join(work, "new.csv"))
for row in predictions:
    print(dict(zip(columns, row)))

# %% The final figures
print(f"local_cluster_notebook: test accuracy {final['accuracy']:.3f}, AUC {final['auc']:.3f} at global step "
      f"{summary['global_step']} ({summary['examples_per_s']:,} examples/s, {summary['training_seconds']} s training)")
if final["accuracy"] < 0.8 or [c[0] for c in predictions[:2]] != ["yes", "no"]:
    raise SystemExit(1)
