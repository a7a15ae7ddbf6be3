"""A member SIGKILLed behind the HTTP gateway: the next infer of the ensemble is answered at once (the
aggregator sees the dropped connection) with the response parameters naming who answered and who is
missing, and the member's own model turns not ready at the gateway within its refresh."""

import signal
import time

import numpy as np
import pytest

from zmqflow.bench.serve import write_random_checkpoint
from tests.gateway.plain_http import infer_json, request
from tests.support import wait_for

pytest.importorskip("starlette", reason="the gateway needs the http extra (Starlette, uvicorn)")

pytestmark = pytest.mark.faults

ROW = np.random.default_rng(1).random((1, 784), dtype=np.float32)


def test_a_killed_member_is_named_missing_in_the_response_parameters(processes, tmp_path):
    members = []
    for seed, name in ((1, "m1"), (2, "m2")):
        write_random_checkpoint(str(tmp_path / name), seed)
        members.append(processes.service("zmqflow.services.serve", ["--checkpoint", str(tmp_path / name), "--backend",
                                                                    "numpy", "--max-delay-secs", "0", "--model-name", name]))
    aggregator = processes.service("zmqflow.services.aggregator", ["--member", members[0].endpoint, "--member",
                                                                   members[1].endpoint, "--deadline-ms", "5000"])
    gateway = processes.service("zmqflow.services.gateway", ["--aggregator", aggregator.endpoint, "--refresh-secs", "0.2"],
                                bind="127.0.0.1:0").endpoint
    before = infer_json(gateway, "ensemble", ROW).json()["parameters"]
    assert sorted(before["answered"].split(",")) == ["m1", "m2"] and before["missing_count"] == 0

    members[1].signal_group(signal.SIGKILL)
    killed = time.monotonic()
    answer = infer_json(gateway, "ensemble", ROW)
    took = time.monotonic() - killed
    parameters = answer.json()["parameters"]
    wait_for(lambda: request(gateway, path="/v2/models/m2/ready").status == 503, 5, "m2 to turn not ready")
    not_ready = time.monotonic() - killed
    print(f"\nensemble answered {took * 1000:.0f} ms after the kill (deadline 5000 ms): {parameters}; m2 not ready "
          f"after {not_ready:.2f} s")
    assert answer.status == 200 and parameters["answered"] == "m1" and parameters["answered_count"] == 1
    assert parameters["missing"].startswith("m2: ") and parameters["missing_count"] == 1
    assert took < 2.0 and not_ready < 5.0
    assert request(gateway, path="/v2/models/ensemble/ready").status == 200  # m1 still answers
