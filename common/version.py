"""zmqflow's version: a leaf module, so that any layer (the CLI's --version, export's metadata) can name it
without importing the package root above every layer."""

__version__ = "0.2.0"
