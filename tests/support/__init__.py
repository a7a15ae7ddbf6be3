"""What every test tier shares: one bounded wait, free loopback ports, processes stopped whatever happens.

`wait_for` polls instead of sleeping; `free_port` / `free_port_offset` find ports nothing listens on;
`Processes` (the `processes` and `module_processes` fixtures of tests/conftest.py) stops every process
it started by PID, also when the test fails. `tiers` holds the rule that every test has one tier marker.
"""

from tests.support.ports import free_port, free_port_offset
from tests.support.processes import Processes
from tests.support.waiting import wait_for

__all__ = ["Processes", "free_port", "free_port_offset", "wait_for"]
