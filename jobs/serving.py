"""`zmqflow.serve(checkpoint)`: a model server process for a checkpoint, from Python, always stopped.

    with zmqflow.serve("ckpt") as model:            # a real `zmqflow serve` process on a free port
        probabilities, info = model.predict_records({"age": [41], "city": ["rome"]})
        info["predicted"]                           # ['cat']: the class names, for a model trained with --data
        model.predict(x)                            # or the model's input tensors; model.schema says which
    with zmqflow.serve(["ckpt-a", "ckpt-b"]) as ensemble:   # one server hosting both, combined in process

The handle is a ModelClient (common/clients/serve.py) on the server's endpoint, with the process's
`endpoint` and `pid`; leaving the block (or `stop()`) stops the process by PID.
"""

import contextlib
import json

from zmqflow.common.processes.children import start_service
from zmqflow.common.clients.serve import ModelClient
from zmqflow.models.kernels import DEFAULT_BACKEND


class ServedModel(ModelClient):
    """A client of the served checkpoint that owns the server process."""

    def __init__(self, process, timeout):
        super().__init__(process.endpoint, timeout=timeout, name="served-model")
        self.process, self.endpoint, self.pid = process, process.endpoint, process.pid

    @property
    def schema(self):
        """What the model takes and answers (inputs, output, raw feature columns): model_info's schema."""
        return self.model_info()["schema"]

    def stop(self):
        self.close()
        self.process.stop()


@contextlib.contextmanager
def serve(checkpoint_dir, model=None, backend=DEFAULT_BACKEND, bind="tcp://127.0.0.1:*", timeout=30.0, log_dir=None,
          trust_checkpoint_code=False, **options):
    """Serve the latest checkpoint in `checkpoint_dir` (the model it records, or `model`, a --model value)
    in its own process while the block runs; a list of directories is an ensemble in that one server
    (services/serve/ensemble.py: combine=, devices=, min_members=). Other options are `zmqflow serve`'s
    (max_batch, max_delay_secs, name, data), given as keywords; `trust_checkpoint_code` is --trust-checkpoint-code."""
    dirs = [checkpoint_dir] if isinstance(checkpoint_dir, (str, bytes)) or not hasattr(checkpoint_dir, "__iter__") \
        else list(checkpoint_dir)
    args = [a for d in dirs for a in ("--checkpoint", str(d))] + ["--backend", backend]
    if trust_checkpoint_code:
        args.append("--trust-checkpoint-code")
    if model is not None:
        args += ["--model", model if isinstance(model, str) else json.dumps(model)]
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    process = start_service("zmqflow.services.serve", args, bind=bind, log_dir=log_dir, name="serve")
    served = ServedModel(process, timeout)
    try:
        yield served
    finally:
        served.stop()
