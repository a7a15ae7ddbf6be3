"""The tests' hosts of their own: common/processes/netns.py's NetworkNamespaces (which `zmqflow bench scaling`
uses too), the zmqflow command to run in them, and a skip, with the reason, where they cannot be made."""

import os
import shutil
import sys

from zmqflow.common.processes.netns import (PREFIX, SUBNETS, NetworkNamespaces, free_subnet,  # noqa: F401
                                            netns_unusable, remove_stale)

ZMQFLOW = shutil.which("zmqflow", path=os.path.dirname(sys.executable)) or shutil.which("zmqflow")
"""The zmqflow command the namespaces run (next to this interpreter, else on PATH), or None."""


def skip_unless_usable():
    """pytest.skip, with the reason, where namespaces cannot be used or the zmqflow command is missing."""
    import pytest
    reason = netns_unusable()
    if reason:
        pytest.skip(reason)
    if ZMQFLOW is None:
        pytest.skip("the zmqflow command is not installed next to this interpreter")
