"""The curves of the web view: a bounded ring of points taken from successive snapshots.

Why in the viewer's memory: the tasks keep no history (Prometheus does, when there is one), and
the page must show training so far without anything else running. `limit` points are kept, so a
view left open for days costs the same as one opened a minute ago. Training points (loss,
rates) are taken at every snapshot; a validation point only when the chief has validated at a
new global step.
"""

from collections import deque

from zmqflow.jobs.status.view import validation_values, worker_values


class History:
    def __init__(self, limit=600):
        if type(limit) is not int or limit < 2:
            raise ValueError(f"history limit must be an int >= 2, got {limit!r}")
        self.training = deque(maxlen=limit)
        self.validation = deque(maxlen=limit)

    def record(self, snap):
        """Add the points `snap` (a probe.snapshot, with add_rates applied) gives."""
        workers = [worker_values(w) for w in snap.get("worker_metrics", []) if w["status"] == "up"]
        losses = [w["loss"] for w in workers if w["loss"] is not None]
        rates = [w["examples_per_s"] for w in workers if w["examples_per_s"] is not None]
        shards = [t["detail"] for t in snap["tasks"] if t.get("service") == "ps-shard" and t.get("detail")]
        step = max((s["version"] for s in shards), default=None)
        if step is None:
            step = max((w["global_step"] for w in workers if w["global_step"] is not None), default=None)
        steps_per_s = [s["steps_per_s"] for s in shards if s.get("steps_per_s") is not None]
        self.training.append({"time": snap["time"], "global_step": step,
                              "loss": sum(losses) / len(losses) if losses else None,
                              "examples_per_s": sum(rates) if rates else None,
                              "steps_per_s": max(steps_per_s) if steps_per_s else None})
        for row in snap.get("worker_metrics", []):
            metrics, at = validation_values(row)
            if metrics and at is not None and (not self.validation or self.validation[-1]["global_step"] != at):
                self.validation.append({"global_step": at, **metrics})

    def series(self):
        """Columns for the charts: {training: {time: [...], global_step: [...], ...}, validation: {...}}."""
        return {"training": _columns(self.training, ("time", "global_step", "loss", "examples_per_s", "steps_per_s")),
                "validation": _columns(self.validation,
                                       ["global_step"] + sorted({k for p in self.validation for k in p} - {"global_step"}))}


def _columns(points, names):
    return {name: [p.get(name) for p in points] for name in names}
