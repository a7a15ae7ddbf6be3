"""Which runs a sweep trains, and what it remembers of them.

Two feeds give the runner (jobs/sweep/runner.py) its runs one at a time, from any number of threads:
- `PointFeed`: a fixed list of points (the grid, or the seeded random search), in memory. No Optuna
  needed; nothing survives the process, so there is no pruning and no resume.
- `StudyFeed`: an Optuna study stored in the sweep's folder (OUT/study.journal, Optuna's journal file),
  so a killed sweep resumes (`--resume`) where it stopped. The grid's and the random search's points
  are enqueued in order (every run id is the one the fixed list gives); `tpe` asks Optuna's TPE
  sampler for each run's point. A pruner (median, successive halving, hyperband) stops a run whose
  reported validation (jobs/sweep/pruning.py) is bad. Each finished run's leaderboard entry is kept
  on its trial, so the leaderboard of a resumed sweep holds the runs of every session.

A run that was training when its sweep stopped (Ctrl-C, SIGTERM, or a kill that left it RUNNING in
the journal) is marked FAIL and its point enqueued again: it trains once more on resume; a run that
finished (complete, pruned or failed) never does.
"""

import json
import math
import os
import threading

from zmqflow.jobs.sweep.space import Range, complete

STUDY_FILE = "study.journal"
STUDY_NAME = "sweep"
SAMPLERS = ("grid", "random", "tpe")
FIXED = ("grid", "random")      # samplers whose points are listed up front
PRUNERS = ("none", "median", "successive-halving", "hyperband")
INSTALL = "pip install 'zmqflow[sweep]'"


class StudyError(ValueError):
    """A sweep that cannot start as asked (Optuna missing, nothing to resume, other settings): says what to do."""


def run_id(index):
    return f"run-{index + 1:03d}"


def import_optuna(needed_for):
    """The optuna module, or StudyError naming what needs it and how to install it."""
    try:
        import optuna
    except ImportError:
        raise StudyError(f"{needed_for} needs Optuna, which is not installed: {INSTALL}") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)   # the sweep prints its own progress
    return optuna


def optuna_installed():
    try:
        import optuna  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------ a fixed list, in memory

class PointRun:
    """One run of a PointFeed: its id and point; nothing to report to."""

    pruning = False

    def __init__(self, index, point):
        self.run_id, self.point, self.number = run_id(index), point, index

    def report(self, step, value):
        return False

    def finish(self, entry):
        pass

    def interrupt(self):
        pass


class PointFeed:
    """The points in order, each once."""

    pruning = False

    def __init__(self, points):
        self.points, self._next, self._lock = list(points), 0, threading.Lock()

    def next(self):
        with self._lock:
            if self._next >= len(self.points):
                return None
            self._next += 1
            return PointRun(self._next - 1, self.points[self._next - 1])

    def entries(self, finished):
        return finished

    @property
    def total(self):
        return len(self.points)


# ------------------------------------------------ an Optuna study on disk

def _encoded(value):
    """A value as an Optuna categorical choice: numbers, strings, booleans as they are; lists as JSON."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else json.dumps(value)


def _categorical(optuna, values):
    """(distribution, {choice: value}) of a list of values (duplicates once)."""
    decode = {}
    for value in values:
        decode.setdefault(_encoded(value), value)
    return optuna.distributions.CategoricalDistribution(list(decode)), decode


def search_space(optuna, space, points=None):
    """({name: distribution}, {name: {choice: value}}) of the searched axes: a sampler's ranges as Optuna
    ranges; the lists (and, for listed points, every value they took) as categorical choices. Without a
    space, every key of the listed points is an axis."""
    distributions, decoders = {}, {}
    if space is None:     # listed points only (a caller's own list): every key is a categorical axis
        space = dict.fromkeys(points[0]) if points else {}
    for name, values in space.items():
        if points is not None:
            distributions[name], decoders[name] = _categorical(optuna, [p[name] for p in points])
        elif isinstance(values, Range):
            from zmqflow.jobs.sweep.space import INTEGER
            if INTEGER[name]:
                distributions[name] = optuna.distributions.IntDistribution(
                    math.ceil(values.low), math.floor(values.high), log=values.log)
            else:
                distributions[name] = optuna.distributions.FloatDistribution(values.low, values.high, log=values.log)
        else:
            distributions[name], decoders[name] = _categorical(optuna, values)
    return distributions, decoders


def make_pruner(optuna, name, every_steps, startup_trials=5):
    """Optuna's pruner of `name`; its steps are global steps, reported every `every_steps`."""
    if name in (None, "none"):
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials)
    if name == "successive-halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=every_steps)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=every_steps)
    raise StudyError(f"unknown pruner {name!r}; choose one of {', '.join(PRUNERS)}")


def study_path(out_dir):
    return os.path.join(out_dir, STUDY_FILE)


class StudyRun:
    """One trial of a StudyFeed: its reports go to the pruner, its entry to the trial."""

    def __init__(self, feed, trial, point):
        self.feed, self.trial, self.point = feed, trial, point
        self.number, self.run_id = trial.number, run_id(trial.number)
        self.pruning = feed.pruning
        self._steps = set()

    def report(self, step, value):
        """Report a validation value at a global step; True when the pruner stops this run."""
        with self.feed.lock:
            if step in self._steps:
                return False
            self._steps.add(step)
            self.trial.report(float(value), int(step))
            return bool(self.trial.should_prune())

    def finish(self, entry):
        """Keep the entry on the trial and close it: complete with its score, pruned, or failed."""
        from optuna.trial import TrialState
        entry["trial"] = self.number
        with self.feed.lock:
            self.trial.set_user_attr("entry", entry)
            value = entry.get("validation_score")
            if entry["status"] == "ok" and value is not None and math.isfinite(value):
                self.feed.study.tell(self.trial, float(value))
            else:
                self.feed.study.tell(self.trial, state=TrialState.PRUNED if entry["status"] == "pruned"
                                     else TrialState.FAIL)

    def interrupt(self):
        """The sweep stopped while this run trained: it trains again on resume."""
        with self.feed.lock:
            self.feed.retry(self.number, self.trial.params)


class StudyFeed:
    """Runs from an Optuna study in OUT/study.journal. `settings`: what makes the sweep's runs what they
    are (space, sampler, epochs, data...); a resume with other settings is refused, naming them."""

    def __init__(self, out_dir, settings, space, base, sampler="grid", points=None, trials=None, pruner="none",
                 every_steps=None, startup_trials=5, direction="maximize", seed=0, resume=False):
        optuna = import_optuna(f"the {sampler} sampler" if sampler == "tpe" else
                               f"the {pruner} pruner" if pruner not in (None, "none") else "--resume")
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend
        if sampler not in SAMPLERS:
            raise StudyError(f"unknown sampler {sampler!r}; choose one of {', '.join(SAMPLERS)}")
        self.sampler, self.base, self.lock = sampler, base, threading.RLock()
        self._states = optuna.trial.TrialState
        self.pruning = pruner not in (None, "none")
        self.points = points
        self.trials = len(points) if sampler in FIXED else trials
        if not self.trials:
            raise StudyError(f"the {sampler} sampler needs a number of runs (--trials N)")
        self.distributions, self.decoders = search_space(optuna, space, points if sampler in FIXED else None)
        self.path = path = study_path(out_dir)
        settings = json.loads(json.dumps(settings, default=str))   # as the journal gives it back
        if resume and not os.path.exists(path):
            raise StudyError(f"--resume: {out_dir} has no sweep to resume (no {STUDY_FILE}); "
                             "run the sweep without --resume first")
        if not resume:
            for stale in (path, path + ".lock"):   # a new sweep in this folder: the previous one is replaced
                if os.path.exists(stale):
                    os.remove(stale)
        os.makedirs(out_dir, exist_ok=True)
        storage = JournalStorage(JournalFileBackend(path))
        sampler_object = (optuna.samplers.TPESampler(seed=seed) if sampler == "tpe" else
                          optuna.samplers.RandomSampler(seed=seed))   # listed points never consult it
        pruner_object = make_pruner(optuna, pruner, every_steps, startup_trials)
        if resume:
            self.study = optuna.load_study(study_name=STUDY_NAME, storage=storage, sampler=sampler_object,
                                           pruner=pruner_object)
            _check_settings(out_dir, self.study.user_attrs.get("settings", {}), settings)
            for trial in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                self.retry(trial.number, trial.params)     # its sweep was killed while it trained
        else:
            self.study = optuna.create_study(study_name=STUDY_NAME, storage=storage, sampler=sampler_object,
                                             pruner=pruner_object, direction=direction)
            self.study.set_user_attr("settings", settings)
            for point in points if sampler in FIXED else ():
                self.study.enqueue_trial({k: _encoded(point[k]) for k in self.distributions})

    def retry(self, number, params):
        """Enqueue a run's point again and mark the interrupted trial failed (it has no entry: no leaderboard row)."""
        self.study.enqueue_trial(params, user_attrs={"retry_of": number})
        self.study.tell(number, state=self._states.FAIL)

    def next(self):
        with self.lock:
            trials = self.study.get_trials(deepcopy=False)
            waiting = [t for t in trials if t.state == self._states.WAITING]
            taken = [t for t in trials if "entry" in t.user_attrs or t.state == self._states.RUNNING]
            if (self.sampler in FIXED and not waiting) or (self.sampler not in FIXED and len(taken) >= self.trials):
                return None
            trial = self.study.ask(self.distributions)
            values = {k: self.decoders[k][v] if k in self.decoders else v for k, v in trial.params.items()}
            return StudyRun(self, trial, complete(values, self.base))

    def entries(self, finished=None):
        """Every finished run's entry, of this session and the ones before it, in trial order."""
        with self.lock:
            return [t.user_attrs["entry"] for t in self.study.get_trials(deepcopy=False) if "entry" in t.user_attrs]

    @property
    def total(self):
        return self.trials


def _check_settings(out_dir, recorded, given):
    differ = sorted(k for k in set(recorded) | set(given) if recorded.get(k) != given.get(k))
    if differ:
        shown = "; ".join(f"{k}: {recorded.get(k)!r} then, {given.get(k)!r} now" for k in differ)
        raise StudyError(f"--resume: the sweep in {out_dir} was started with other settings ({shown}); "
                         "give the same options to resume it, or another --out for a new sweep")
