"""`zmqflow bench scaling` on a tiny grid: 1 ps x {1, 2} workers of the MNIST MLP at 20mbit and at 1gbit.

The rows are real jobs across network namespaces (bench/scaling.py): the ps link carries a pull and a push
of the MLP's variables (318,040 bytes each way) per step, whatever the bandwidth; at 20mbit the shaped links
hold the job to what they carry (each direction at most 2.5 MB/s: a worker's link its pull and its batch, a
few steps a second) and say so (the row's limit is a link), at 1gbit it runs several times faster. The plot
is written, and no namespace is left behind. Needs root (`make test-netns`); skips with the reason otherwise.
"""

import json
import shutil
import subprocess

import pytest

from tests.support.netns import ZMQFLOW, skip_unless_usable

# 4 jobs of 14 processes each on 2 cores: under a minute alone, minutes when the machine is busy
pytestmark = [pytest.mark.integration, pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(600)]

MLP_BYTES = 318_040          # 784x100 + 100 + 100x10 + 10 float32: a pull, or a push, of the MNIST MLP
SLOW, FAST = "20mbit", "1gbit"


def namespaces():
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    skip_unless_usable()
    before = namespaces()
    plot = tmp_path_factory.mktemp("scaling") / "scaling.png"
    bench = subprocess.Popen([ZMQFLOW, "bench", "scaling", "--num-ps", "1", "--num-workers", "1,2", "--models", "mlp",
                              "--bandwidth", f"{SLOW},{FAST}", "--delay-secs", "0", "--duration-secs", "1.5", "--json",
                              "--plot", str(plot)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = bench.communicate(timeout=540)
    finally:   # SIGTERM, not subprocess.run's SIGKILL: the bench stops its tasks and deletes its namespaces
        if bench.poll() is None:
            bench.terminate()
            bench.communicate(timeout=60)
    assert bench.returncode == 0, out[-3000:] + err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), plot, namespaces() - before


def test_every_point_is_a_row_with_the_mlps_bytes_per_step_on_the_ps_link(study):
    result, _, _ = study
    rows = {(r["bandwidth"], r["num_workers"]): r for r in result["rows"]}
    assert sorted(rows) == sorted((b, w) for b in (SLOW, FAST) for w in (1, 2)), list(rows)
    for (bandwidth, workers), row in rows.items():
        assert row["model"] == "mlp" and row["num_ps"] == 1 and row["model_bytes"] == MLP_BYTES, row
        assert row["examples_per_s"] > 0, row
        ps0 = row["links"]["ps0"]
        # the ps sends a pull and receives a push of the whole model per step (TCP/IP headers: a few %)
        assert 0.9 * MLP_BYTES <= ps0["tx_bytes_per_step"] <= 1.25 * MLP_BYTES, (bandwidth, workers, ps0)
        assert 0.9 * MLP_BYTES <= ps0["rx_bytes_per_step"] <= 1.25 * MLP_BYTES, (bandwidth, workers, ps0)
        # the workers' links carry the same pulls and pushes, and the batches the input host sent them
        batches = row["links"]["input"]["tx_bytes_per_step"]
        assert batches >= 100 * 784 * 4 * 0.9, row["links"]["input"]   # 100 float32 rows of 784 a step
        assert 0.85 * (2 * MLP_BYTES + batches) <= row["worker_bytes_per_step"] <= 1.25 * (2 * MLP_BYTES + batches), row
        assert row["limit"] in ("ps link", "worker link", "cpu", "-"), row
    assert [k["num_ps"] for k in result["knees"]] == [1, 1]
    assert {k["bandwidth"] for k in result["knees"]} == {SLOW, FAST}


def test_the_shaping_holds_the_slow_links_to_their_rate(study):
    result, _, _ = study
    rows = {(r["bandwidth"], r["num_workers"]): r for r in result["rows"]}
    for workers in (1, 2):
        slow, fast = rows[(SLOW, workers)], rows[(FAST, workers)]
        # 20mbit carries 2.5 MB/s each way: no link sends faster (htb's bursts: a few %)
        assert slow["ps_link_utilisation"] <= 1.1 and slow["worker_link_utilisation"] <= 1.1, slow
        # ... and one of them is full: the link, not the CPU, limits the job
        assert slow["limit"] in ("ps link", "worker link"), slow
        steps_cap = 2.5e6 * 1.1 / MLP_BYTES          # the ps sends a pull per step
        assert slow["steps_per_s"] <= steps_cap, slow
        assert fast["examples_per_s"] >= 3 * slow["examples_per_s"], (fast, slow)


def test_the_plot_is_written_and_no_namespace_is_left(study):
    _, plot, left = study
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not left, f"left behind: {left}"


def test_without_a_usable_bandwidth_it_exits_2_with_the_reason():
    done = subprocess.run([ZMQFLOW or "zmqflow", "bench", "scaling", "--bandwidth", "fast", "--delay-secs", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "bandwidth 'fast'" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_without_root_it_exits_2_saying_why():
    skip_unless_usable()      # root, to run it as nobody
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed: it runs the bench as another user")
    done = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", ZMQFLOW, "bench", "scaling"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "network namespaces need root (running as uid 65534)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
