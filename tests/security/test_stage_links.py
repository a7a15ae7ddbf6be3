"""Pipeline stage links (issue 23, item 6) take only the job's stages: a PAIR had one peer, and the first
stranger to connect used to take it; the ROUTER a stage binds now (issue 25: a join has several stages
before it) must not take a stranger's messages either. Without CURVE the stages know each other by the job token
(ZAP PLAIN), with CURVE by a member's key; a stranger, a wrong key and an HTTP POST are refused in the
handshake, and the real stage still gets through."""

import http.client

import numpy as np
import pytest
import zmq

from zmqflow.common.errors import AbortedError
from zmqflow.common.rpc import encryption as curve
from zmqflow.common.wire import frames as wire
from zmqflow.services.worker.stage_link import FORWARD, StageLink

pytestmark = pytest.mark.service


def stranger(endpoint, **options):
    """A DEALER named as stage 0 that connects first and sends a message, as an attacker on the host would."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.routing_id = b"stage-0"
    for name, value in options.items():
        setattr(sock, name, value)
    sock.connect(endpoint)
    try:
        sock.send_multipart(wire.request_frames(FORWARD, 0, {"micro": 99}, [np.zeros(1)]), zmq.NOBLOCK)
    except zmq.Again:
        pass   # never connected: refused in the handshake
    return sock


def the_stage_before_gets_through(bound, **options):
    before = StageLink(index=0, downstream={1: bound.endpoint}, timeout=5.0, **options)
    try:
        before.send(1, FORWARD, {"micro": 0}, [np.arange(3.0)])
        source, kind, args, tensors = bound.recv("the stage before")
        assert (source, kind, args, tensors[0].tolist()) == (0, FORWARD, {"micro": 0}, [0.0, 1.0, 2.0])
    finally:
        before.close()


def test_without_curve_only_the_job_token_opens_a_stage_link():
    bound = StageLink(index=1, bind="tcp://127.0.0.1:*", timeout=1.0, job_token="the-job")
    strangers = [stranger(bound.endpoint),                                            # no credential at all
                 stranger(bound.endpoint, plain_username=b"stage", plain_password=b"guessed")]
    try:
        with pytest.raises(AbortedError, match="no the stage before within 1 s"):
            bound.recv("the stage before")                                           # nothing of theirs arrived
        bound.timeout = 5.0
        the_stage_before_gets_through(bound, job_token="the-job")
    finally:
        for sock in strangers:
            sock.close(0)
        bound.close()


def test_an_http_post_to_a_stage_link_is_refused_and_the_stage_goes_on():
    bound = StageLink(index=1, bind="tcp://127.0.0.1:*", timeout=1.0, job_token="the-job")
    host, port = bound.endpoint[len("tcp://"):].rsplit(":", 1)
    try:
        conn = http.client.HTTPConnection(host, int(port), timeout=2)
        with pytest.raises((OSError, http.client.HTTPException)):
            conn.request("POST", "/", body=b"x" * 8192)
            conn.getresponse()
        conn.close()
        with pytest.raises(AbortedError, match="no the stage before"):
            bound.recv("the stage before")
        bound.timeout = 5.0
        the_stage_before_gets_through(bound, job_token="the-job")
    finally:
        bound.close()


def test_with_curve_only_a_member_key_opens_a_stage_link(tmp_path, monkeypatch):
    keys = str(tmp_path / "keys")
    curve.generate(keys, ["member", "serving"])
    monkeypatch.setenv(curve.KEY_ENV, "member")
    bound = StageLink(index=1, bind="tcp://127.0.0.1:*", timeout=1.0, curve_dir=keys)
    serving = curve.ClientKeys(keys, "serving")
    gateway = stranger(bound.endpoint, curve_secretkey=serving.secret, curve_publickey=serving.public,
                       curve_serverkey=serving.server_public)   # an authorized key, but not a member's
    try:
        with pytest.raises(AbortedError, match="no the stage before"):
            bound.recv("the stage before")
        bound.timeout = 5.0
        the_stage_before_gets_through(bound, curve_dir=keys)
    finally:
        gateway.close(0)
        bound.close()


def test_a_stage_link_without_curve_or_a_job_token_is_refused(monkeypatch):
    monkeypatch.delenv("ZMQFLOW_JOB_TOKEN", raising=False)
    monkeypatch.delenv(curve.ENV, raising=False)
    with pytest.raises(Exception, match="a pipeline stage link needs CURVE keys"):
        StageLink(bind="tcp://127.0.0.1:*", timeout=1.0)
