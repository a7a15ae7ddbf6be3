"""The gateway's cost: the same rows at the same closed-loop concurrency, over ZeroMQ and through the gateway.

Closed loop: each of `concurrency` threads sends its next request when the previous one is answered,
over ZeroMQ (an AggregatorClient per thread), over HTTP (a keep-alive http.client connection per
thread, the Open Inference Protocol's JSON body, or binary tensors, encoded once) or over gRPC (a
channel per thread, ModelInfer with raw_input_contents, as Triton's clients send it; where grpcio is
installed). The paths run in alternating rounds so that a noisy neighbour on the shared machine hits
them alike; the overhead is the difference of the medians measured in the same run.
"""

import http.client
import importlib.util
import json
import socket
import threading
import time
import urllib.parse

import numpy as np

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.processes.children import start_service

TARGET_OVERHEAD_P50_MS = 1.0
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


def _http_sender(url, payload):
    body, headers = payload
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    connection.connect()  # http.client writes headers and body apart: TCP_NODELAY, as curl sets it
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send():
        connection.request("POST", "/v2/models/ensemble/infer", body, headers)
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
