"""A model's outputs as the answers a user reads: class names, labels, or values.

Shared by `zmqflow predict` (a file of rows), the model server (a records request) and the
aggregator (the combined answer to a records request), so the three say the same thing.
"""

import numpy as np


def predicted(outputs, task, classes=None, label_columns=None):
    """Per row: the most probable class's name (multiclass, binary), the names of the labels with
    probability >= 0.5 (multi_label), or the value (regression, or a task not known)."""
    outputs = np.asarray(outputs)
    if task in ("multiclass", "binary") and classes:
        return [classes[int(i)] for i in np.argmax(outputs, axis=1)]
    if task == "multi_label" and label_columns:
        return [[str(c) for c, p in zip(label_columns, row) if p >= 0.5] for row in outputs]
    return [float(v) for v in outputs.reshape(len(outputs), -1)[:, 0]]


def labels_of(spec):
    """What `predicted` needs of a fitted data spec: {task, classes, columns} (plain JSON)."""
    return {"task": spec.label.task, "classes": spec.stats["classes"] if spec.stats else None,
            "columns": [str(c) for c in spec.label.columns]}
