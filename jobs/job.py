"""`zmqflow.Job`: a training job of real processes on this machine, as a handle a notebook can hold.

    job = zmqflow.Job(num_ps=1, num_workers=2, data="flowers.yaml", model="mlp", epochs=8)
    job.start()
    try:
        for point in job.metrics():        # global step, examples/s, loss, validation, while it runs
            print(point)
        summary = job.wait()               # test metrics, steps, examples/s; AbortedError if a task failed
    finally:
        job.stop()                         # every process of the job, by PID

`with zmqflow.Job(...) as job:` (or `zmqflow.local_cluster(...)`, the same) starts it and always stops
it; `job.run()` is start, wait and stop in one call. A job the program forgets to stop is stopped
when the handle is collected or the interpreter exits. The job is a JobSpec (jobs/spec.py) and its
processes are LocalCluster's (jobs/local_cluster.py); what LocalCluster offers besides (`ps_stats`,
`log_dir`, ...) the handle offers too.
"""

import os
import weakref

from zmqflow.common.errors import AbortedError, FailedPreconditionError
from zmqflow.common.renames import renamed_keywords
from zmqflow.jobs import job_metrics
from zmqflow.jobs.local_cluster import LocalCluster


class Job:
    """start / metrics / wait / stop over a LocalCluster; `status` says where it is."""

    @renamed_keywords(ps="num_ps", workers="num_workers")
    def __init__(self, num_ps=None, num_workers=None, data=None, model=None, model_options=None, spec=None,
                 **options):
        from zmqflow.inputs.data_spec import fit, is_mnist_sample, load_spec, load_tables
        from zmqflow.models.spec import resolve_model
        if data is not None:      # bad data fails here, before any process starts
            data = load_spec(data)
            fit(data, load_tables(data)["train"])
        if model_options:
            model = {**resolve_model(model, data_mlp=data is not None and not is_mnist_sample(data)), **model_options}
        if options.get("log_dir"):
            os.makedirs(options["log_dir"], exist_ok=True)
        self.cluster = LocalCluster(spec, num_ps=num_ps, num_workers=num_workers, model=model, data=data, **options)
        self.summary = None
        self._status = "created"
        self._finalizer = weakref.finalize(self, self.cluster.supervisor.stop_all)

    # ------------------------------------------------ the life of a job

    def start(self):
        """Start every process (broker, input, ps shards, workers); returns the job. A job starts once."""
        if self._status != "created":
            raise FailedPreconditionError(f"the job was started already (it is {self._status})")
        self._status = "running"
        try:
            self.cluster.start()
        except BaseException:
            self._status = "failed"
            self.cluster.stop()
            raise
        return self

    def wait(self, timeout=None, progress=False):
        """Until every worker has exited: the job's summary (global step, examples/s, test metrics, ...).
        A failed task, or no end within `timeout` s when given (default: no limit), stops the whole job and
        raises AbortedError naming why."""
        self._require_started()
        if self.summary is not None:
            return self.summary
        try:
            self.summary = self.cluster.wait(progress=progress, timeout=timeout)
        except BaseException:
            self._status = "failed"
            self.cluster.stop()
            raise
        self._status = "finished"
        return self.summary

    def run(self, timeout=None, progress=False):
        """start, wait and stop: the summary of a whole job (stopped after `timeout` s when given)."""
        try:
            if self._status == "created":
                self.start()
            return self.wait(timeout=timeout, progress=progress)
        finally:
            self.stop()

    def metrics(self, interval=0.5):
        """A point every `interval` s while the job runs, then a last one (running False):
        {global_step, examples, examples_per_s, loss, validation, elapsed_s, running}. `loss` is the
        chief's latest, `validation` the latest validation ({step, accuracy, ...}) when the data has a
        validation split. A failed task stops the job and raises AbortedError naming it."""
        self._require_started()

        def check():
            try:
                job_metrics.raise_on_failure(self.cluster)
            except AbortedError:
                self._status = "failed"
                raise
        return job_metrics.stream(self.cluster, interval, check)

    def stop(self):
        """Stop every process of the job by PID (those still running); safe to call at any time, twice."""
        if self._status in ("created", "running"):
            self._status = "stopped"
        self.cluster.stop()

    @property
    def running(self):
        """True while a worker of a started job is alive."""
        return self._status == "running" and any(w.alive() for w in self.cluster.workers)

    @property
    def status(self):
        """created, running, exited (every worker ended; wait() says how), finished (wait() returned its
        summary), failed (a task failed, or no end in time) or stopped (by stop() before either)."""
        if self._status == "running" and self.cluster.workers and not self.running:
            return "exited"      # the workers ended; wait() tells whether it went well
        return self._status

    def pids(self):
        """The process ids of every task the job started (stopped or not)."""
        return [child.pid for child in self.cluster.supervisor.children]

    # ------------------------------------------------ as a context manager, and LocalCluster's own

    def __enter__(self):
        if self._status == "created":
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def __getattr__(self, name):
        if name == "cluster":       # not set yet: __init__ failed
            raise AttributeError(name)
        return getattr(self.cluster, name)

    def __repr__(self):
        cluster = self.cluster.spec.cluster
        return f"<zmqflow.Job {self.status}: {cluster.ps} ps, {cluster.workers} workers>"

    def _require_started(self):
        if self._status == "created":
            raise FailedPreconditionError("the job has not been started: call start() (or use `with`)")


@renamed_keywords(ps="num_ps", workers="num_workers")
def local_cluster(num_ps=None, num_workers=None, data=None, model=None, model_options=None, spec=None, **options):
    """A training job of real processes on this machine (a `zmqflow.Job`), always stopped when the block ends:

        with zmqflow.local_cluster(num_ps=1, num_workers=2, data="flowers.yaml", model="mlp", epochs=8) as job:
            for point in job.metrics():    # global step, examples/s, loss, validation while it runs
                print(point)
            summary = job.wait()           # test metrics, steps, examples/s; AbortedError if a task failed

    `data`: a data spec (a YAML path, a dict, or `mnist`; default the shipped MNIST sample); `model`:
    a built-in name, `path.py:build`, a spec dict or file, fitted to the data's inputs and classes;
    `model_options`: {option: value}; `spec`: a JobSpec (jobs/spec.py) the other options change; other
    options by the flat names job_spec takes (mode, epochs, batch_size, optimizer, input, checkpoint_dir,
    validate_every_steps, ...)."""
    return Job(num_ps=num_ps, num_workers=num_workers, data=data, model=model, model_options=model_options, spec=spec,
               **options)


def replicate(devices=2, mode="sync", num_ps=None, data=None, model=None, model_options=None, spec=None, **options):
    """In-graph replication as a job of real processes (a `zmqflow.Job`): one client drives a replica per device,
    each a worker task computing on its own share of the input, as TensorFlow's in-graph client puts a tower on
    each of `/job:worker/task:0`, `/job:worker/task:1`, ... and runs them from one session:

        with zmqflow.replicate(["/job:worker/task:0", "/job:worker/task:1"], mode="sync", epochs=3) as job:
            summary = job.wait()     # sync: summary["steps"] == summary["global_step"], one update a step

    `devices`: the replicas' devices, replica i on worker task i (`/gpu:1`, `/job:worker/task:1/cpu:0`), or a
    count of replicas on their tasks' default devices. `mode`: sync (the replicas' gradients averaged into one
    update a step) or async (each replica's gradients pushed as it finishes). Other arguments as
    `local_cluster` takes them."""
    if isinstance(devices, int) and not isinstance(devices, bool):
        count, devices = devices, None
    else:
        devices = tuple(devices)
        count = len(devices)
    return Job(num_ps=num_ps, num_workers=count, data=data, model=model, model_options=model_options, spec=spec,
               mode=mode, replication="in-graph", devices=devices or None, **options)
