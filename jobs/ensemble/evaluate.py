"""Accuracy of predict functions on a labelled split, in batches (no sockets here)."""

import numpy as np


def accuracy(predict, x, y, batch=500):
    """Share of rows whose arg-max class of `predict(x_batch)` equals the label."""
    correct = 0
    for start in range(0, len(y), batch):
        probabilities = predict(x[start:start + batch])
        correct += int(np.sum(np.argmax(probabilities, axis=1) == y[start:start + batch]))
    return correct / len(y) if len(y) else 0.0


def verdict(ensemble_accuracy, member_accuracies):
    """One line answering the seeds' exercise: does the ensemble beat its members?"""
    best = max(member_accuracies)
    if ensemble_accuracy > best:
        return f"the ensemble beats its best member by {100 * (ensemble_accuracy - best):.2f} points"
    if ensemble_accuracy == best:
        return "the ensemble ties its best member"
    return f"the ensemble trails its best member by {100 * (best - ensemble_accuracy):.2f} points"
