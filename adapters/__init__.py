"""Models written in other frameworks, as models of zmqflow's protocol (zmqflow.models.protocol).

`zmqflow.adapters.jax`: a pure function and its parameter pytree (`pip install zmqflow[jax]`).
`zmqflow.adapters.torch`: an `nn.Module` (`pip install zmqflow[torch]`).
The core install needs no framework; each adapter imports its own only when used.
"""
