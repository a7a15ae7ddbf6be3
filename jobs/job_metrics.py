"""A running job's metrics, read from what its tasks already publish: no new service, no new socket kind.

- the global step and the examples applied so far: ps 0's `stats` (its version and the pushes it
  applied, each one a mini-batch), through the same client `zmqflow train`'s progress bar uses;
- the loss and the validation results: the workers' summaries files (services/worker/hooks.py's
  SummaryHook: one JSON line every N of a worker's steps, one per validation on the chief), read as
  they grow; the loss is the latest any worker wrote.

examples/s is the job's: the examples applied between two points over the time between them.
"""

import contextlib
import json
import os
import time

from zmqflow.common.errors import AbortedError, OpError
from zmqflow.common.clients.ps import PsShardClient


def read_json(path):
    """A JSON file's value, or None while it is missing or half written."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class JsonLinesTail:
    """The complete lines appended to a JSON-lines file since the last call (the file may not exist yet)."""

    def __init__(self, path):
        self.path, self._offset, self._partial = path, 0, ""

    def new_records(self):
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            f.seek(self._offset)
            text = f.read()
            self._offset = f.tell()
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()          # a line still being written
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue                     # never a reason to stop following a job
        return records


def stream(cluster, interval=0.5, check=lambda: None):
    """Yield a point every `interval` s until every worker of `cluster` (a started LocalCluster) has
    exited, then a last one with running False. `check()` raises when a task of the job failed."""
    tails = [JsonLinesTail(path) for path in cluster.summaries_files]
    started = time.monotonic()
    point = {"global_step": 0, "examples": 0, "examples_per_s": 0.0, "loss": None, "validation": None}
    previous = None   # (time, examples) of the last point
    with (PsShardClient(cluster.shards[0].endpoint, heartbeat_interval=2.0) if cluster.shards
          else contextlib.nullcontext()) as ps0:      # an all-reduce job has no ps: the summaries say the step
        while True:
            running = any(w.alive() for w in cluster.workers)
            check()
            now = time.monotonic()
            try:
                if ps0 is not None:
                    stats = ps0.stats(timeout=min(2.0, max(interval, 0.2)))
                    point["global_step"] = stats["version"]
                    point["examples"] = stats["pushes_applied"] * cluster.spec.training.batch_size
            except OpError:
                pass          # ps 0 exits at the end (the chief shuts it down): keep its last figures
            if not running:   # the final figures are the workers' result files: ps 0 may be gone already
                results = [read_json(path) for path in cluster.result_files]
                if results[0] and isinstance(results[0].get("global_step"), int):
                    point["global_step"] = results[0]["global_step"]
                if all(results):
                    point["examples"] = sum(r.get("examples", 0) for r in results)
            if previous is not None and now > previous[0]:
                point["examples_per_s"] = round((point["examples"] - previous[1]) / (now - previous[0]), 1)
            previous = (now, point["examples"])
            records = sorted((r for tail in tails for r in tail.new_records()), key=lambda r: r.get("time", 0))
            for record in records:
                if "validation" in record:
                    point["validation"] = {"step": record["step"], **record["validation"]}
                elif "loss" in record:
                    point["loss"] = record["loss"]
                    if ps0 is None and running:   # all-reduce: every worker's batch in every step (near enough)
                        step = point["global_step"] = max(point["global_step"], record.get("step", 0))
                        point["examples"] = step * cluster.spec.training.batch_size * len(cluster.workers)
            yield {**point, "elapsed_s": round(now - started, 3), "running": running}
            if not running:
                return
            time.sleep(interval)


def raise_on_failure(cluster):
    """AbortedError naming the failed task, once the job's other tasks are stopped."""
    try:
        cluster._raise_on_failure()
    except AbortedError:
        cluster.stop()
        raise
