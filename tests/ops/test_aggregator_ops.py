"""An aggregator's per-member timeouts in its metrics and in `zmqflow status` (fake members in threads)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from zmqflow.common.clients.aggregator import AggregatorClient
from tests.aggregator.fakes import FakeMember
from tests.ops.helpers import metrics_url, scrape, value

pytestmark = pytest.mark.service


def test_member_timeouts_are_counted_per_member_and_shown_by_status(processes):
    fast, slow = FakeMember(offset=0.0).start(), FakeMember(offset=1.0, delay=2.0).start()
    try:
        proc = processes.service("zmqflow.services.aggregator", ["--member", fast.endpoint, "--member", slow.endpoint,
                                                                 "--deadline-ms", "100", "--metrics-bind", "0"])
        with AggregatorClient(proc.endpoint, timeout=10.0) as client:
            client.predict(np.ones((2, 4), np.float32))
        samples = scrape(metrics_url(proc.endpoint))
        assert value(samples, "zmqflow_aggregator_member_timeouts_total", member=slow.endpoint) == 1
        assert value(samples, "zmqflow_aggregator_member_answers_total", member=fast.endpoint) == 1
        assert value(samples, "zmqflow_rpc_requests_total", service="aggregator", op="predict", code="OK") == 1
        status = subprocess.run([sys.executable, "-m", "zmqflow", "status", "--once", "--json",
                                 "--aggregator", proc.endpoint], capture_output=True, text=True, timeout=30)
        assert status.returncode == 0, status.stderr
        members = {m["address"]: m for m in json.loads(status.stdout)["tasks"][0]["detail"]["members"]}
        assert members[slow.endpoint]["timeouts"] == 1 and members[fast.endpoint]["healthy"]
    finally:
        processes.stop_all()  # the aggregator before the members it talks to
        fast.shutdown()
        slow.shutdown()
