import os
import shutil

import pytest

from zmqflow.common.rpc import encryption as curve

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(items):
    """Every test in this folder is in the security tier (make test runs it; make test-security alone)."""
    for item in items:
        if str(item.path).startswith(HERE + os.sep):
            item.add_marker(pytest.mark.security)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """A key directory (client, client-2 authorized) and an outsider: a client pair the service never authorized."""
    root = tmp_path_factory.mktemp("curve")
    keys, other, outsider = str(root / "keys"), str(root / "other"), str(root / "outsider")
    curve.generate(keys, ["client-2"])
    curve.generate(other)
    os.makedirs(outsider)
    shutil.copy(os.path.join(keys, "server.key"), outsider)  # it knows the real service key...
    for name in ("client.key", "client.key_secret"):  # ...but has a pair of its own
        shutil.copy(os.path.join(other, name), outsider)
    return {"keys": keys, "other": other, "outsider": outsider}
