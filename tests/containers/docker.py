"""Docker and Compose for the container tier: which binaries exist, and a compose project that is
always taken down (containers, network and volumes) by the test that started it."""

import json
import os
import shutil
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(argv, timeout=120, check=True, env=None, **kwargs):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, **kwargs)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def why_no_docker():
    """None when a Docker daemon answers and some Compose is installed, else the reason to skip."""
    if not shutil.which("docker"):
        return "no `docker` command on this machine"
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                          timeout=30)
    if info.returncode != 0:
        lines = (info.stderr or info.stdout).strip().splitlines()
        return "no Docker daemon answers: " + (lines[-1] if lines else f"docker info exited {info.returncode}")
    if compose_command() is None:
        return "neither `docker compose` nor `docker-compose` is installed"
    return None


def compose_command():
    """`docker compose` (v2) when present, else `docker-compose` (1.29), else None."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


class ComposeProject:
    """`docker compose -p NAME -f docker-compose.yml ...` with the variables of one test run."""

    def __init__(self, name, env):
        self.name, self.env = name, {**os.environ, **env}
        self.base = compose_command() + ["-p", name, "-f", os.path.join(ROOT, "docker-compose.yml")]

    def __call__(self, *args, timeout=600, check=True, env=None):
        return run(self.base + list(args), timeout=timeout, check=check, env={**self.env, **(env or {})}, cwd=ROOT)

    def container(self, service):
        """`docker inspect` of the service's (first) container, as a dict."""
        ids = run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={self.name}",
                   "--filter", f"label=com.docker.compose.service={service}"]).stdout.split()
        assert ids, f"no container for service {service}"
        return json.loads(run(["docker", "inspect", ids[0]]).stdout)[0]

    def wait_healthy(self, service, limit):
        deadline = time.monotonic() + limit
        while True:
            state = self.container(service)["State"]
            health = state.get("Health", {}).get("Status")
            if health == "healthy":
                return
            assert state["Status"] == "running", f"{service} is {state['Status']} (exit {state.get('ExitCode')})"
            assert time.monotonic() < deadline, f"{service} not healthy within {limit} s (health: {health})"
            time.sleep(1.0)

    def leftovers(self):
        """What of this project still exists: containers, networks, volumes."""
        label = f"label=com.docker.compose.project={self.name}"
        return {"containers": run(["docker", "ps", "-aq", "--filter", label]).stdout.split(),
                "networks": run(["docker", "network", "ls", "-q", "--filter", label]).stdout.split(),
                "volumes": run(["docker", "volume", "ls", "-q", "--filter", label]).stdout.split()}

    def down(self):
        return self("down", "-v", "--remove-orphans", "--timeout", "10", timeout=180, check=False)
