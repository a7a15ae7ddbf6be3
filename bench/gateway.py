"""The gateway's cost: the same rows at the same closed-loop concurrency, over ZeroMQ and through the gateway.

Closed loop: each of `concurrency` threads sends its next request when the previous one is answered,
over ZeroMQ (an AggregatorClient per thread), over HTTP (a keep-alive http.client connection per
thread, the Open Inference Protocol's JSON body, or binary tensors, encoded once) or over gRPC (a
channel per thread, ModelInfer with raw_input_contents, as Triton's clients send it; where grpcio is
installed). The paths run in alternating rounds so that a noisy neighbour on the shared machine hits
them alike; the overhead is the difference of the medians measured in the same run.

`http_load` is the throughput comparison of the issue's table: the gateway in front of one model server and
MLServer (the Open Inference Protocol server of Seldon, on FastAPI and uvicorn) serving the same weights, each
under the same HTTP load (wrk, 2 threads, 8 connections, a 1-row JSON infer), in alternating rounds. MLServer
runs from its own virtual environment (its dependencies are not ours): on PATH, or named by
ZMQFLOW_BENCH_MLSERVER; without it the phase says so and gives the command that compares (MLSERVER_COMMAND).
"""

import http.client
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import numpy as np

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.processes.children import spawn, start_service

TARGET_OVERHEAD_P50_MS = 0.5
ROUNDS = 3


def compare(aggregator, x, seconds, concurrency=2, log_dir=None):
    """{gateway_*, zmq_*} latencies (ms), QPS and the gateway's p50 overhead for `x` sent to `aggregator`."""
    try:
        import starlette  # noqa: F401  (the http extra)
    except ImportError:
        return {"gateway_skipped": "the http extra is not installed (pip install 'zmqflow[http]')"}
    grpc_address = f"127.0.0.1:{_free_port()}" if importlib.util.find_spec("grpc") else None
    gateway = start_service("zmqflow.services.gateway", ["--aggregator", aggregator, "--log-level", "WARNING",
                                                         *(["--grpc-bind", grpc_address] if grpc_address else [])],
                            bind="127.0.0.1:0", log_dir=log_dir)
    try:
        paths = {"zmq": lambda: _zmq_sender(aggregator, x),
                 "gateway": lambda: _http_sender(gateway.endpoint, _json_body(x)),
                 "gateway_binary": lambda: _http_sender(gateway.endpoint, _binary_body(x))}
        if grpc_address:
            paths["gateway_grpc"] = lambda: _grpc_sender(grpc_address, x)
        latencies = {name: [] for name in paths}
        counts = {name: 0 for name in paths}
        for name, make in paths.items():  # connected and warm before anything is timed
            _closed_loop(make, concurrency, 0.3)
        for _ in range(ROUNDS):
            for name, make in paths.items():
                done = _closed_loop(make, concurrency, seconds / ROUNDS)
                latencies[name] += done
                counts[name] += len(done)
    finally:
        gateway.stop()
    result = {"concurrency": concurrency}
    if not grpc_address:
        result["gateway_grpc_skipped"] = "the grpc extra is not installed (pip install 'zmqflow[grpc]')"
    for name, values in latencies.items():
        values = np.asarray(values)
        result.update({f"{name}_p50_ms": round(float(np.percentile(values, 50)), 3),
                       f"{name}_p99_ms": round(float(np.percentile(values, 99)), 3),
                       f"{name}_qps": round(counts[name] / seconds, 1)})
    for name in ("gateway", "gateway_binary", "gateway_grpc")[:len(paths) - 1]:
        result[f"{name}_overhead_p50_ms"] = round(result[f"{name}_p50_ms"] - result["zmq_p50_ms"], 3)
    return result


def _closed_loop(make_sender, concurrency, seconds):
    """Latencies (ms) of `concurrency` threads each sending back to back for `seconds`."""
    out, lock = [], threading.Lock()

    def worker():
        send, close = make_sender()
        mine, end = [], time.perf_counter() + seconds
        try:
            while (start := time.perf_counter()) < end:
                send()
                mine.append((time.perf_counter() - start) * 1000.0)
        finally:
            close()
        with lock:
            out.extend(mine)
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 30)
    return out


def _zmq_sender(aggregator, x):
    client = AggregatorClient(aggregator, timeout=10.0)
    return (lambda: client.predict(x)), client.close


def _json_body(x):
    body = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    return body, {"Content-Type": "application/json"}


def _binary_body(x):
    header = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return (header + x.tobytes(), {"Content-Type": "application/octet-stream",
                                   "Inference-Header-Content-Length": str(len(header))})


def _http_sender(url, payload, model="ensemble"):
    body, headers = payload
    path = f"/v2/models/{model}/infer"
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    connection.connect()  # http.client writes headers and body apart: TCP_NODELAY, as curl sets it
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send():
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        content = response.read()
        if response.status != 200:
            raise RuntimeError(f"gateway answered {response.status}: {content[:200]!r}")
    return send, connection.close


def _grpc_sender(address, x):
    """ModelInfer of `x` as raw_input_contents over one channel (the gateway's own generated stubs)."""
    import grpc
    from zmqflow.services.gateway import grpc_predict_v2_pb2 as pb
    from zmqflow.services.gateway.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub

    request = pb.ModelInferRequest(model_name="ensemble", raw_input_contents=[x.astype("<f4").tobytes()])
    request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    channel = grpc.insecure_channel(address)
    infer = GRPCInferenceServiceStub(channel).ModelInfer

    def send():
        infer(request, timeout=10)
    return send, channel.close


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------ HTTP load: the gateway + a model server against MLServer

HTTP_THREADS, HTTP_CONNECTIONS = 2, 8
TARGET_MLSERVER_QPS_RATIO = 2.0
MLSERVER_ENV = "ZMQFLOW_BENCH_MLSERVER"
MLSERVER_COMMAND = ("python3 -m venv /tmp/mlserver && /tmp/mlserver/bin/pip install mlserver==1.7.1 'uvloop<0.22' && "
                    f"{MLSERVER_ENV}=/tmp/mlserver/bin/mlserver zmqflow bench serve --json")
"""How to compare with MLServer where it is not installed: in a venv of its own (its dependencies are not ours)."""

MLSERVER_RUNTIME = '''"""The bench's MNIST MLP for MLServer: the zmqflow checkpoint's weights, the same forward pass in numpy."""
import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceResponse


class NumpyMLP(MLModel):
    async def load(self):
        with np.load(self.settings.parameters.uri) as weights:
            self.layers = [(weights[f"w{i}"], weights[f"b{i}"]) for i in range(len(weights.files) // 2)]
        return True

    async def predict(self, payload):
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32)
        for i, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if i < len(self.layers) - 1:
                x = 1 / (1 + np.exp(-x))
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return InferenceResponse(model_name=self.name,
                                 outputs=[NumpyCodec.encode_output("probabilities", e / e.sum(axis=1, keepdims=True))])
'''


def http_load(server, model, layers, x, seconds, log_dir, rounds=2):
    """{http_*}: req/s, p50 and p99 of the gateway in front of the model server `server` (serving `model`)
    and of MLServer serving the same weights (`layers`: [(weights, biases), ...]), each under the same HTTP
    load (wrk, HTTP_THREADS threads and HTTP_CONNECTIONS connections, a 1-row JSON infer; else this module's
    closed loop with as many connections), in alternating rounds; medians of the rounds, and the ratios."""
    body, headers = _json_body(x)
    gateway = start_service("zmqflow.services.gateway", ["--serve", server, "--log-level", "WARNING"],
                            bind="127.0.0.1:0", log_dir=log_dir)
    targets = {"zmqflow": f"{gateway.endpoint}/v2/models/{model}/infer"}
    result = {"http_load": _load_generator(), "http_connections": HTTP_CONNECTIONS}
    mlserver = None
    try:
        mlserver, why_not = _start_mlserver(layers, log_dir)
        if mlserver is None:
            result["mlserver_skipped"] = why_not
            result["mlserver_command"] = MLSERVER_COMMAND
        else:
            targets["mlserver"] = f"{mlserver.endpoint}/v2/models/mlp/infer"
        runs = {name: [] for name in targets}
        for name, url in targets.items():   # warm: connections made, code paths run once
            _http_load(url, body, headers, 0.5)
        for _ in range(rounds):
            for name, url in targets.items():
                runs[name].append(_http_load(url, body, headers, seconds / rounds))
    finally:
        gateway.stop()
        if mlserver is not None:
            mlserver.stop()
    for name, done in runs.items():
        for key in ("qps", "p50_ms", "p99_ms"):
            result[f"http_{name}_{key}"] = round(float(np.median([run[key] for run in done])), 3)
        result[f"http_{name}_errors"] = sum(run["errors"] for run in done)
    if "mlserver" in runs:
        result["http_qps_vs_mlserver"] = round(result["http_zmqflow_qps"] / result["http_mlserver_qps"], 2)
        result["http_p99_vs_mlserver"] = round(result["http_zmqflow_p99_ms"] / result["http_mlserver_p99_ms"], 2)
    return result


def _load_generator():
    return f"wrk -t{HTTP_THREADS} -c{HTTP_CONNECTIONS}" if shutil.which("wrk") else \
        f"closed loop, {HTTP_CONNECTIONS} keep-alive connections (wrk not installed)"


def _http_load(url, body, headers, seconds):
    """{qps, p50_ms, p99_ms, errors} of `seconds` of infers of `body` at `url`."""
    wrk = shutil.which("wrk")
    if wrk is None:
        parsed = urllib.parse.urlsplit(url)
        model = parsed.path.split("/")[3]
        latencies = _closed_loop(lambda: _http_sender(f"http://{parsed.netloc}", (body, headers), model),
                                 HTTP_CONNECTIONS, seconds)
        return {"qps": len(latencies) / seconds, "p50_ms": float(np.percentile(latencies, 50)),
                "p99_ms": float(np.percentile(latencies, 99)), "errors": 0}
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(f'wrk.method = "POST"\nwrk.body = {_lua_string(body.decode())}\n' +
                     "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items()))
    try:
        out = subprocess.run([wrk, f"-t{HTTP_THREADS}", f"-c{HTTP_CONNECTIONS}", f"-d{max(1, round(seconds))}s",
                              "--latency", "-s", script.name, url], capture_output=True, text=True,
                             timeout=seconds + 60, check=True).stdout
    finally:
        os.unlink(script.name)
    return parse_wrk(out)


def parse_wrk(out):
    """{qps, p50_ms, p99_ms, errors} of wrk --latency's report (errors: non-2xx answers and socket errors)."""
    qps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    found = {q: _ms(*re.search(rf"^\s+{q}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()) for q in (50, 99)}
    errors = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses:\s+(\d+)", out))
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors += sum(map(int, socket_errors.groups())) if socket_errors else 0
    return {"qps": qps, "p50_ms": found[50], "p99_ms": found[99], "errors": errors}


def _ms(value, unit):
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def _lua_string(text):
    return "[==[" + text + "]==]"


def _start_mlserver(layers, log_dir):
    """(MLServer serving the MLP `layers` as model "mlp", None) once it answers, or (None, why not)."""
    executable = os.environ.get(MLSERVER_ENV) or shutil.which("mlserver")
    if executable is None:
        return None, f"mlserver is not installed here (nor named by {MLSERVER_ENV})"
    folder = tempfile.mkdtemp(prefix="mlserver-", dir=log_dir)
    np.savez(os.path.join(folder, "weights.npz"), **{f"{kind}{i}": array for i, pair in enumerate(layers)
                                                      for kind, array in zip("wb", pair)})
    with open(os.path.join(folder, "zmqflow_mlp_runtime.py"), "w") as f:
        f.write(MLSERVER_RUNTIME)
    port = _free_port()
    with open(os.path.join(folder, "settings.json"), "w") as f:
        json.dump({"http_port": port, "grpc_port": _free_port(), "metrics_port": _free_port(), "debug": False}, f)
    with open(os.path.join(folder, "model-settings.json"), "w") as f:
        json.dump({"name": "mlp", "implementation": "zmqflow_mlp_runtime.NumpyMLP",
                   "parameters": {"uri": os.path.join(folder, "weights.npz")}}, f)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    child = spawn([executable, "start", folder], "mlserver", os.path.join(log_dir, "mlserver.log"),
                  env={**env, "PYTHONPATH": folder}, cwd=folder)
    child.endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline and child.alive():
        try:
            with urllib.request.urlopen(f"{child.endpoint}/v2/models/mlp/ready", timeout=1.0):
                return child, None
        except OSError:
            time.sleep(0.25)
    why = f"MLServer ({executable}) did not get ready within 60 s: {child.log()[-400:]}"
    child.stop()
    return None, why
