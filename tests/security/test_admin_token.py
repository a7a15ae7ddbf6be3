"""The admin token's rules without sockets: where a service's token comes from and goes, which one a
client sends, and how a presented one is judged (none: UNAUTHENTICATED, a wrong one: PERMISSION_DENIED)."""

import os
import stat

import pytest

from zmqflow.common.rpc import admin_token
from zmqflow.common.errors import InvalidArgumentError, PermissionDeniedError, UnauthenticatedError
from zmqflow.common.wire.protocol import ADMIN, ADMIN_OPS, AggregatorOps, BrokerOps, PsOps, ReplicaOps, ops_with_role

pytestmark = pytest.mark.unit


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    """A runtime directory of this test and no token in the environment."""
    monkeypatch.setenv(admin_token.RUNTIME_ENV, str(tmp_path / "run"))
    monkeypatch.delenv(admin_token.ENV, raising=False)
    monkeypatch.delenv(admin_token.FILE_ENV, raising=False)
    monkeypatch.delenv(admin_token.JOB_TOKEN.env, raising=False)
    monkeypatch.setattr(admin_token, "_known", {})    # launchers' tokens of this process: none
    return tmp_path / "run"


def test_the_admin_ops_are_listed_once_per_service():
    assert ops_with_role(BrokerOps, ADMIN) == {"reset", "shutdown"}
    assert ops_with_role(PsOps, ADMIN) == {"init", "restore", "reset", "shutdown"}
    assert ops_with_role(AggregatorOps, ADMIN) == {"add_member", "remove_member"}
    assert ops_with_role(ReplicaOps, ADMIN) == {"finish"}          # it ends an in-graph replica
    assert ADMIN_OPS == {"reset", "shutdown", "init", "restore", "add_member", "remove_member", "finish"}


def test_a_host_and_port_name_one_service_whatever_local_address_dials_it():
    keys = {admin_token.endpoint_key(a) for a in ("tcp://127.0.0.1:5555", "tcp://0.0.0.0:5555", "tcp://localhost:5555",
                                                  "tcp://[::1]:5555", "tcp://*:5555")}
    assert keys == {"tcp-localhost-5555"}
    assert admin_token.endpoint_key("tcp://10.0.0.7:5555") == "tcp-10.0.0.7-5555"
    assert admin_token.endpoint_key("ipc:///tmp/a b/broker.sock") == "ipc-tmp_a_b_broker.sock"


def test_a_local_service_token_is_never_sent_to_another_host_on_its_port(runtime):
    token, path = admin_token.for_service("tcp://0.0.0.0:5611")
    job, _ = admin_token.for_service("tcp://0.0.0.0:5611", kind=admin_token.JOB_TOKEN)
    assert admin_token.for_client("tcp://127.0.0.1:5611") == token
    assert admin_token.for_client("tcp://127.0.0.1:5611", admin_token.JOB_TOKEN) == job != token
    for elsewhere in ("tcp://evil.example:5611", "tcp://10.0.0.7:5611"):
        assert admin_token.for_client(elsewhere) is None
        assert admin_token.for_client(elsewhere, admin_token.JOB_TOKEN) is None


def test_a_logged_request_never_shows_its_token():
    header = {"op": "init", "token": "s3cret", "args": {}}
    assert "s3cret" not in repr(admin_token.without_token(header)) and header["token"] == "s3cret"


def test_a_service_without_a_token_writes_a_new_one_only_its_user_can_read(runtime):
    token, path = admin_token.for_service("tcp://127.0.0.1:5601")
    assert path == str(runtime / "admin-token-tcp-localhost-5601") and len(token) >= 40
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(runtime).st_mode) == 0o700
    assert admin_token.for_client("tcp://localhost:5601") == token       # a client on this machine finds it
    again, _ = admin_token.for_service("tcp://127.0.0.1:5601")           # a restart on the port: a new one
    assert again != token and admin_token.for_client("tcp://127.0.0.1:5601") == again
    admin_token.forget_file(path, token)                                  # the old service's exit keeps it
    assert os.path.exists(path)
    admin_token.forget_file(path, again)
    assert not os.path.exists(path)


def test_the_environment_wins_and_nothing_is_written(runtime, monkeypatch, tmp_path):
    monkeypatch.setenv(admin_token.ENV, "from-env")
    assert admin_token.for_service("tcp://127.0.0.1:5602") == ("from-env", None)
    assert not runtime.exists()
    monkeypatch.delenv(admin_token.ENV)
    (tmp_path / "token").write_text("from-file\n")
    monkeypatch.setenv(admin_token.FILE_ENV, str(tmp_path / "token"))
    assert admin_token.for_service("tcp://127.0.0.1:5602") == ("from-file", None)
    assert admin_token.for_client("tcp://127.0.0.1:5602") == "from-file"


def test_a_launcher_token_is_used_by_this_process_clients(runtime):
    assert admin_token.for_client("tcp://127.0.0.1:5603") is None        # nothing known: send none
    admin_token.remember("tcp://127.0.0.1:5603", "job-token")
    assert admin_token.for_client("tcp://localhost:5603") == "job-token"
    admin_token.forget("tcp://127.0.0.1:5603", "another-job")             # not its token: kept
    assert admin_token.for_client("tcp://127.0.0.1:5603") == "job-token"
    admin_token.forget("tcp://127.0.0.1:5603", "job-token")               # the service stopped
    assert admin_token.for_client("tcp://127.0.0.1:5603") is None
    assert admin_token.child_env("job-token", {"PATH": "/bin"}) == {"PATH": "/bin", admin_token.ENV: "job-token"}


def test_a_bad_token_file_is_named(tmp_path):
    with pytest.raises(InvalidArgumentError, match=f"admin token file {tmp_path}/missing: No such file"):
        admin_token.read_token_file(str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(InvalidArgumentError, match="is empty"):
        admin_token.read_token_file(str(tmp_path / "empty"))


def test_no_token_is_unauthenticated_and_a_wrong_one_permission_denied():
    admin_token.check("secret", "secret", "shutdown", "queue-broker", "tcp://127.0.0.1:5555")  # passes
    for missing in (None, ""):
        with pytest.raises(UnauthenticatedError, match="shutdown on the queue-broker at tcp://127.0.0.1:5555 is an "
                                                       "admin op: it needs the admin token"):
            admin_token.check("secret", missing, "shutdown", "queue-broker", "tcp://127.0.0.1:5555")
    for wrong in ("secreT", "secret2", 12, ["secret"]):
        with pytest.raises(PermissionDeniedError, match="^init on the ps-shard at tcp://h:1: wrong admin token$"):
            admin_token.check("secret", wrong, "init", "ps-shard", "tcp://h:1")
