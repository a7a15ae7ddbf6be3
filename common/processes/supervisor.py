"""Supervisor: the processes of one job, started together, followed, and stopped together.

docs/design.md, Jobs: a job ends when its work ends or when one of its tasks fails; then the
others are stopped in order (the last started first) and the job says which task failed.
`zmqflow train` (jobs/local_cluster.py), `zmqflow up` (jobs/up/runner.py), sweeps,
ensembles, the demo and the tests own their children through one of these, so nothing
a job started outlives it: leaving the `with` block, also by an exception or Ctrl-C,
stops every child still running.

One job, one admin token and one job token (common/rpc/admin_token.py): every child gets them in
ZMQFLOW_ADMIN_TOKEN and ZMQFLOW_JOB_TOKEN, so the job's processes may push, enqueue, save... and the
chief init, restore and shut down the job's services while no other local process may (without
CURVE); this process's clients of the services it started use them too.
"""

import sys

from zmqflow.common.rpc import admin_token
from zmqflow.common.processes.children import spawn, start_process, start_service


class Supervisor:
    def __init__(self, log_dir=None, stop_timeout=5.0, admin_token_value=None, job_token_value=None):
        self.log_dir, self.stop_timeout = log_dir, stop_timeout
        self.admin_token = admin_token_value or admin_token.for_job()   # the job's, given to every child
        self.job_token = job_token_value or admin_token.for_job(admin_token.JOB_TOKEN)
        self.children = []          # in start order
        self.codes = {}             # child -> exit code, once seen (a restarted task is a new child)

    # ------------------------------------------------ starting

    def adopt(self, child):
        """Own a child started elsewhere (it is stopped with the others)."""
        self.children.append(child)
        return child

    def start_service(self, module, args=(), **options):
        """A service that binds a port; returns once it serves (common/processes/children.py's start_service)."""
        options.setdefault("log_dir", self.log_dir)
        options["env"] = {**(options.get("env") or {}), **self._tokens()}
        child = self.adopt(start_service(module, args, **options))
        admin_token.remember(child.endpoint, self.admin_token)
        admin_token.remember(child.endpoint, self.job_token, admin_token.JOB_TOKEN)
        return child

    def _tokens(self):
        return {admin_token.ENV: self.admin_token, admin_token.JOB_TOKEN.env: self.job_token}

    def start_process(self, module, args=(), **options):
        """`python -m module args...` with its output in a log file."""
        options.setdefault("log_dir", self.log_dir)
        options["env"] = {**(options.get("env") or {}), **self._tokens()}
        return self.adopt(start_process(module, args, **options))

    def start(self, name, argv, env=None, cwd=None, stdout=None, log_path=None):
        """Any command; OSError when it cannot be started (no such program)."""
        env = admin_token.child_env(self.admin_token, env, self.job_token)
        return self.adopt(spawn(argv, name, log_path=log_path, env=env, cwd=cwd, stdout=stdout))

    def python(self, name, module, args=(), **options):
        """`python -m module args...` with this interpreter, output as `start` says."""
        return self.start(name, [sys.executable, "-m", module, *args], **options)

    # ------------------------------------------------ following

    def exits(self):
        """[(child, code)] of the children that exited since the last call, in start order."""
        new = []
        for child in self.children:
            code = child.returncode
            if code is not None and child not in self.codes:
                self.codes[child] = code
                new.append((child, code))
        return new

    def running(self):
        return [child for child in self.children if child.alive()]

    def first_failure(self):
        """(child, code) of the first child that exited non-zero, else None."""
        self.exits()
        for child in self.children:
            code = self.codes.get(child)
            if code:
                return child, code
        return None

    # ------------------------------------------------ stopping

    def stop_all(self, timeout=None, report=None):
        """Stop every running child's group in order, the last started first, as Compose does: SIGTERM,
        then SIGKILL after `timeout` s, before the next. Dependents go before what they depend on, so a
        reader still reaches the broker to close its queues, a worker its ps. `report(child, code, killed)`
        hears each one that was running; returns {child: code} of every child."""
        timeout = self.stop_timeout if timeout is None else timeout
        live = [child for child in reversed(self.children) if child.alive()]
        for child in live:
            child.terminate()
            code, killed = child.wait_stopped(timeout)
            self.codes[child] = code
            if report:
                report(child, code, killed)
        for child in self.children:
            if child.returncode is not None:
                self.codes.setdefault(child, child.returncode)
            if child.endpoint:   # its port may serve another service, with another token, next
                admin_token.forget(child.endpoint, self.admin_token)
                admin_token.forget(child.endpoint, self.job_token, admin_token.JOB_TOKEN)
        return dict(self.codes)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop_all()

