"""A PyTorch module trained by zmqflow's ps shards and workers (its parameters and BatchNorm buffers
live on the ps), then served from the checkpoint under torch.inference_mode.

    make test-torch                                   # installs PyTorch's CPU build and runs this too
    python examples/torch_model.py
    zmqflow train --model examples/torch_model.py:build
"""

import os
import sys
import tempfile


def build(input_signature):
    """What `--model examples/torch_model.py:build` calls on every task."""
    import torch

    from zmqflow.adapters.torch import TorchModel
    (shape, _), = input_signature.values()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(shape[0], 128), torch.nn.BatchNorm1d(128), torch.nn.ReLU(),
                              torch.nn.Linear(128, 10))
    return TorchModel(net, input_shape=shape)


def main():
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch_model: PyTorch is not installed; `make test-torch` installs it (skipped)")
        return 0
    from zmqflow.jobs.local_cluster import run_training
    checkpoints = tempfile.mkdtemp(prefix="torch-model-")
    summary = run_training(progress=False, model={"type": f"{os.path.abspath(__file__)}:build"}, epochs=5,
                           checkpoint_dir=checkpoints)
    print(f"torch_model: test accuracy {summary['test_accuracy']:.4f} after 5 epochs "
          f"({summary['examples_per_s']:,} examples/s; checkpoints in {checkpoints})")
    return 0 if summary["test_accuracy"] >= 0.85 else 1


if __name__ == "__main__":
    sys.exit(main())
