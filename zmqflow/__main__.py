"""`python -m zmqflow` is the `zmqflow` command."""

from zmqflow.cli.main import main

main()
