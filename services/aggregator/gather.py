"""One client request fanned out to members: who was asked, who answered, who did not and why.

No sockets: the fan-out policy (fanout.py) records each member's reply or failure here, and
the server asks whether the request can be answered now (everyone asked has responded, or
`min_members` can no longer be reached). `outcome()` combines what arrived or names who
answered for the error.
"""

from zmqflow.common.errors import DeadlineExceededError, UnavailableError, error_from_code
from zmqflow.inputs.predictions import predicted
from zmqflow.models.combine import combine_answers


class Gather:
    __slots__ = ("call", "mode", "combine", "custom", "min_members", "pending", "answers", "weights", "failures",
                 "codes", "started", "shape", "rid", "labels")

    def __init__(self, call, mode, combine_name, min_members, started, custom=None):
        self.call, self.mode, self.combine, self.min_members = call, mode, combine_name, min_members
        self.custom = custom  # the aggregator's own combine function, if it has one
        self.pending = {}    # address -> the member-side request id still awaited
        self.answers = {}    # address -> probabilities, in arrival order
        self.weights = {}    # address -> weight of an answer (weighted combine)
        self.failures = {}   # address -> why it did not count: timeout, unhealthy, removed, error: ...
        self.codes = {}      # address -> the member's error code, for errors
        self.started = started
        self.shape = None    # the input's shape; an answer must have as many rows
        self.rid = None      # the member-side id of its latest request (a replica retry gets a new one)
        self.labels = None   # a records request: the task and classes a member reported, to name predictions

    def asked(self, address, rid):
        self.pending[address] = rid

    def skipped(self, address, reason):
        self.failures[address] = reason

    def answer(self, address, probs, weight):
        self.pending.pop(address, None)
        self.answers[address] = probs
        self.weights[address] = weight

    def fail(self, address, reason, code=None):
        self.pending.pop(address, None)
        self.failures[address] = reason
        if code is not None:
            self.codes[address] = code

    def finished(self):
        """True when nothing more can change the answer: all asked have responded, or too few can."""
        return not self.pending or len(self.answers) + len(self.pending) < self.min_members

    def info(self):
        return {"mode": self.mode, "combine": self.combine, "answered": list(self.answers),
                "missing": dict(self.failures), "min_members": self.min_members}

    def outcome(self):
        """(probs, info) from the answers so far; too few answers raise, naming who answered."""
        info = self.info()
        if len(self.answers) >= self.min_members and self.answers:
            combined = combine_answers(self.combine, self.answers, self.weights, self.custom)
            if self.labels is not None:
                info["predicted"] = predicted(combined, self.labels.get("task"), self.labels.get("classes"),
                                              self.labels.get("columns"))
            return combined, info
        raise self._shortfall()

    def _shortfall(self):
        answered = ", ".join(self.answers) or "none"
        missing = "; ".join(f"{a}: {r}" for a, r in self.failures.items()) or "no members"
        text = f"{len(self.answers)} of {self.min_members} needed members answered (answered: {answered}; " \
               f"missing: {missing})"
        if not self.failures and not self.answers:
            return UnavailableError("the aggregator has no members to ask")
        codes = set(self.codes.values())
        if len(codes) == 1 and len(self.codes) == len(self.failures):  # every member refused it the same way
            return error_from_code(codes.pop(), text)
        if all(r == "unhealthy" for r in self.failures.values()) and not self.answers:
            return UnavailableError(f"no healthy member to ask ({text})")
        return DeadlineExceededError(text)
