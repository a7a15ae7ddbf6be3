"""The gateway through `tritonclient.http`, a client of the protocol nobody here wrote: health, metadata, and
infer with JSON and binary tensors against the ensemble and a single member, equal to the ZeroMQ path."""

import numpy as np
import pytest

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.clients.serve import ModelClient

httpclient = pytest.importorskip("tritonclient.http", reason="the test extra installs tritonclient[http]")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.service

ROWS = np.random.default_rng(3).random((4, 784), dtype=np.float32)


@pytest.fixture
def client(topology):
    client = httpclient.InferenceServerClient(topology.gateway.removeprefix("http://"), network_timeout=10.0)
    yield client
    client.close()


def infer(client, model, binary, **options):
    data = httpclient.InferInput("input", list(ROWS.shape), "FP32")
    data.set_data_from_numpy(ROWS, binary_data=binary)
    wanted = httpclient.InferRequestedOutput("probabilities", binary_data=binary)
    return client.infer(model, [data], outputs=[wanted], **options)


def test_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("ensemble") and client.is_model_ready("m2")
    metadata = client.get_model_metadata("ensemble")
    assert metadata["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": [-1, 784]}
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_on_the_ensemble_and_a_member(client, topology, binary):
    result = infer(client, "ensemble", binary, timeout=2_000_000)  # microseconds: the ensemble's deadline
    with AggregatorClient(topology.aggregator.endpoint) as zmq_client:
        # the mean of the members in their arrival order: equal up to float32 rounding
        np.testing.assert_allclose(result.as_numpy("probabilities"), zmq_client.predict(ROWS)[0], rtol=1e-6)
    assert result.get_response()["parameters"]["answered_count"] == 3
    member = infer(client, "m2", binary).as_numpy("probabilities")
    with ModelClient(topology.members["m2"].endpoint) as zmq_client:
        np.testing.assert_array_equal(member, zmq_client.predict(ROWS)[0])


def test_errors_reach_the_client_with_their_message(client):
    with pytest.raises(InferenceServerException, match="unknown model 'nope'") as error:
        infer(client, "nope", True)
    assert error.value.status() == "404"
