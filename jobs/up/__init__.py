"""`zmqflow up`: run a docker-compose file as local processes on this machine.

compose.py reads and checks the file, interpolate.py expands `${VAR:-default}`,
localize.py maps service hosts, ports and volumes onto this machine, runner.py
starts the processes in dependency order and stops them by process group, and
logs.py prefixes their output as compose does.
"""
