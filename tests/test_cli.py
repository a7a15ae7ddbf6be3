"""The command lines: umbrella group, operator commands against a real broker, the demo, clean shutdown."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from zmqflow.common.clients.queues import FIFOQueue
from zmqflow.cli.main import main
from tests.support import free_port

pytestmark = pytest.mark.service


@pytest.mark.unit
def test_every_command_has_help():
    runner = CliRunner()
    for args in ([], ["broker"], ["ping"], ["queues"], ["bench"], ["bench", "broker"], ["demo"]):
        result = runner.invoke(main, args + ["--help"])
        assert result.exit_code == 0, (args, result.output)
        assert "Usage:" in result.output


def test_python_dash_m_broker_help():
    out = subprocess.run([sys.executable, "-m", "zmqflow.services.broker", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "--bind" in out.stdout


def test_ping_and_queues_against_a_running_broker(broker):
    q = FIFOQueue(5, "int32", shapes=[[]], shared_name="cli-listed", container="cli", broker=broker)
    q.enqueue(1)
    runner = CliRunner()
    ping = runner.invoke(main, ["ping", "--address", broker, "--json"])
    assert ping.exit_code == 0, ping.output
    assert json.loads(ping.output)["service"] == "queue-broker"
    listed = runner.invoke(main, ["queues", "--address", broker])
    row = [line for line in listed.output.splitlines() if "cli-listed" in line]
    assert row and row[0].split()[3:6] == ["FIFOQueue", "1", "5"]


@pytest.mark.timeout(10)  # fails within its --timeout-secs: a hang is a failure, well before the suite's 120 s
def test_ping_of_a_dead_address_fails_fast():
    result = CliRunner().invoke(main, ["ping", "--address", f"127.0.0.1:{free_port()}", "--timeout-secs", "0.5"])
    assert result.exit_code == 1 and "Unavailable" in result.output


def test_broker_exits_zero_on_sigterm(processes):
    proc = processes.service("zmqflow.services.broker")
    assert proc.stop() == 0
    assert "stopped" in proc.log()


@pytest.mark.integration
@pytest.mark.slow
def test_demo_tells_the_whole_story(tmp_path):
    result = CliRunner().invoke(main, ["demo", "--epochs", "2", "--sweep-epochs", "1", "--load-secs", "1",
                                       "--work-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "delivered 5000 of 5000 instances exactly once: True" in result.output
    assert "broker stopped (exit 0)" in result.output
    summary = result.output.split("== 5. summary")[1]
    accuracies = [float(line.split()[-1]) for line in summary.splitlines() if "test accuracy" in line]
    assert len(accuracies) == 6 and all(0.5 < a <= 1.0 for a in accuracies), summary  # trained, 3 members, 2 ensembles
    assert "QPS answered" in summary and "members at the aggregator" in summary
    assert summary.count("unhealthy (disconnected)") == 1   # the killed member, known by its dropped connection
    assert (tmp_path / "sweep" / "leaderboard.json").exists()
    assert "kill member" in result.output
