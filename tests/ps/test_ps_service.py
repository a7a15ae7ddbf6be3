"""The ps-shard service over real sockets: init, pull/push, bf16, sparse rows, sync waits and stalls,
checkpoints restored onto another number of shards, TF_CONFIG, shutdown."""

import contextlib
import json
import time
import os
import socket

import numpy as np
import pytest

from zmqflow.common.errors import DeadlineExceededError, FailedPreconditionError, InvalidArgumentError
from zmqflow.models.spec import MNIST_MLP
from zmqflow.models.registry import load_model, model_variables
from zmqflow.common.cluster.placement import place
from zmqflow.common.processes.children import start_service
from zmqflow.common.clients.ps import PsClient, PsShardClient
from zmqflow.common.rpc.client import RpcClient
from zmqflow.common.variables import IndexedSlices
from zmqflow.common.wire.protocol import PsOps

pytestmark = pytest.mark.service

SPEC = json.dumps(MNIST_MLP)
SGD = json.dumps({"kind": "sgd", "learning_rate": 0.5})


def shards(tmp_path, n=1, *extra):
    return [start_service("zmqflow.services.ps", ["--task-index", str(i), "--num-ps", str(n), "--model", SPEC,
                                          "--optimizer", SGD, "--checkpoint-root", str(tmp_path), *extra],
                          log_dir=str(tmp_path)) for i in range(n)]


def client(procs, **kw):
    return PsClient([p.endpoint for p in procs], place(model_variables(MNIST_MLP), len(procs)), **kw)


@pytest.fixture
def initial():
    return load_model(MNIST_MLP).initial_values(1)


@contextlib.contextmanager
def sync_job(tmp_path, initial, num_shards=1, total=2):
    """Sync shards aggregating 2 replicas of `total`, initialized, and two workers' clients that pulled."""
    procs = shards(tmp_path, num_shards, "--mode", "sync", "--replicas-to-aggregate", "2", "--total-num-replicas",
                   str(total))
    try:
        a, b = client(procs, name="a"), client(procs, name="b")
        a.initialize(initial)
        a.pull(), b.pull()
        yield a, b
    finally:
        for p in procs:
            p.stop()


def test_full_packed_pulls_of_one_version_share_one_answer_until_the_values_move(initial):
    """The snapshot goes out as one SentTensor per version (and per bf16): pyzmq lends it once, not once a pull
    (common/wire/frames.py). Handlers called directly, the loop not run."""
    from zmqflow.common.rpc.service import Call
    from zmqflow.common.wire.frames import reply_frames, unpack
    from zmqflow.services.ps.server import PsService
    placement = place(model_variables(MNIST_MLP), 1)
    pieces = {p.key: p for p in placement.for_shard(0)}
    service = PsService("tcp://127.0.0.1:*", 0, pieces, {"optimizer": json.loads(SGD)})
    try:
        service.store.initialize({key: initial[p.variable] for key, p in pieces.items()})
        first, again = service._variables_answer(None, packed=True), service._variables_answer(None, packed=True)
        assert again[1][0] is first[1][0] and again[0] == first[0] and first[0]["version"] == 0
        call = Call(b"worker", 1, "pull", PsOps.Pull(packed=True), [], None, 0.0)   # header and frame made once
        frames = reply_frames(7, 0, None, *service._pull_answer(call))
        assert frames[1:] == [first[1][0].frame] and unpack(frames[0]) == unpack(reply_frames(7, 0, None, *first)[0])
        released = service._pull_answer(call, released=True)   # a released sync wait says so: not the cached answer
        assert released[0]["released"] is True and released[1] is first[1]
        half = service._variables_answer(None, bf16=True, packed=True)
        assert half[1][0] is not first[1][0] and half[1][0].spec[1][0] < first[1][0].spec[1][0]
        assert service._variables_answer(None, bf16=True, packed=True)[1][0] is half[1][0]
        service.rule.push({key: np.ones_like(initial[p.variable]) for key, p in pieces.items()}, version=0, replica=0)
        moved = service._variables_answer(None, packed=True)
        assert moved[1][0] is not first[1][0] and moved[0]["version"] == 1
        layout = moved[0]["layout"][0]
        weights = np.frombuffer(moved[1][0].frame.buffer, np.uint8)[layout[2]:].view(np.float32)[:initial[
            pieces[moved[0]["names"][0]].variable].size]
        np.testing.assert_allclose(weights, initial[pieces[moved[0]["names"][0]].variable].reshape(-1) - 0.5, rtol=1e-6)
    finally:
        service.close()


def test_init_pull_push_and_pull_if_newer(tmp_path, initial):
    procs = shards(tmp_path, 2)
    try:
        ps = client(procs)
        ps.initialize(initial)
        pulled = ps.pull()
        for name, value in initial.items():
            np.testing.assert_array_equal(pulled[name], value)
        with RpcClient(procs[0].endpoint) as raw:   # a packed pull: one frame, the same values as one per piece
            (plain, tensors), (packed, frame) = raw.call("pull", {}), raw.call("pull", {"packed": True})
            assert len(frame) == 1 and frame[0].dtype == np.uint8 and packed["names"] == plain["names"]
            assert [[str(t.dtype), list(t.shape)] for t in tensors] == [entry[:2] for entry in packed["layout"]]
            for entry, t in zip(packed["layout"], tensors):
                offset = entry[2]
                np.testing.assert_array_equal(frame[0][offset:offset + t.nbytes].view(t.dtype).reshape(t.shape), t)
            some, parts = raw.call("pull", {"packed": True, "bf16": True, "names": plain["names"][1:2]})
            assert some["layout"] == [["bfloat16", list(tensors[1].shape), 0]] and len(parts[0]) % 64 == 0
        assert ps.pull_if_newer() is None  # nothing changed
        grads = {k: np.ones_like(v) for k, v in initial.items()}
        results = ps.push(grads)
        assert all(r["applied"] for r in results)
        after = ps.pull_if_newer()
        np.testing.assert_allclose(after["hidden/weights"], initial["hidden/weights"] - 0.5, rtol=1e-6)
        assert ps.versions == [1, 1]
        results, exchanged = ps.push_async(grads, pull=True).result()   # a step's push and pull in one round trip
        assert all(r["applied"] for r in results) and ps.versions == [2, 2]
        for name, value in ps.pull().items():   # the variables after this push, from both shards
            np.testing.assert_array_equal(exchanged[name], value)
        np.testing.assert_allclose(exchanged["hidden/weights"], initial["hidden/weights"] - 1.0, rtol=1e-6)
        ps.shutdown()
        assert [p.proc.wait(10) for p in procs] == [0, 0]  # shutdown is a protocol: exit 0
    finally:
        for p in procs:
            p.stop()


def test_bf16_transfer_halves_the_bytes_and_still_trains(tmp_path, initial):
    procs = shards(tmp_path)
    try:
        ps = client(procs, bf16=True)
        ps.initialize(initial)
        pulled = ps.pull()
        assert pulled["hidden/weights"].dtype == np.float32
        np.testing.assert_allclose(pulled["hidden/weights"], initial["hidden/weights"], rtol=1e-2, atol=1e-3)
        ps.push({k: np.full_like(v, 0.25) for k, v in initial.items()})
        after = ps.pull()
        np.testing.assert_allclose(after["softmax/biases"], initial["softmax/biases"] - 0.125, atol=1e-2)
        stats = ps.stats()[0]
        assert stats["bytes_pushed"] == sum(v.size for v in initial.values()) * 4  # applied as float32
    finally:
        for p in procs:
            p.stop()


def test_sparse_rows(tmp_path, initial):
    procs = shards(tmp_path)
    try:
        ps = client(procs)
        ps.initialize(initial)
        ps.pull()
        rows = ps.pull_rows("hidden/weights", [3, 7])
        np.testing.assert_array_equal(rows, initial["hidden/weights"][[3, 7]])
        result = ps.push_sparse("hidden/weights", [3], np.ones((1, 100), np.float32))
        assert result["applied"]
        after = ps.pull_rows("hidden/weights", [3, 4])
        np.testing.assert_allclose(after[0], initial["hidden/weights"][3] - 0.5, rtol=1e-6)
        np.testing.assert_array_equal(after[1], initial["hidden/weights"][4])
    finally:
        for p in procs:
            p.stop()


def test_sparse_rows_of_a_table_split_over_two_shards(tmp_path, initial):
    """A 784-row table in two row blocks on two shards: rows are read and updated (Adam, with its
    slot rows) where they live, and a worker moves only the bytes of the rows it touches."""
    adam = json.dumps({"kind": "adam", "learning_rate": 0.1})
    procs = shards(tmp_path, 2, "--max-shard-bytes", "160000", "--optimizer", adam)
    try:
        placement = place(model_variables(MNIST_MLP), 2, max_shard_bytes=160000)
        blocks = placement.pieces_of("hidden/weights")
        assert [p.shard for p in blocks] == [0, 1] and blocks[1].row_start < 700
        ps = PsClient([p.endpoint for p in procs], placement)
        ps.initialize(initial)
        ps.pull()
        table = initial["hidden/weights"]
        touched = np.array([700, 3, 400, 3])                       # both blocks, out of order, one repeated
        np.testing.assert_array_equal(ps.pull_rows("hidden/weights", touched), table[touched])
        before = [s["bytes_pulled"] for s in ps.stats()]
        ps.pull_rows("hidden/weights", touched)
        moved = sum(s["bytes_pulled"] for s in ps.stats()) - sum(before)
        assert moved == 4 * 100 * 4 and moved * 196 == table.nbytes   # 4 rows instead of 784
        results = ps.push_sparse("hidden/weights", [3, 700], np.ones((2, 100), np.float32))
        assert len(results) == 2 and all(r["applied"] for r in results)
        after = ps.pull_rows("hidden/weights", [3, 700, 4, 699])
        np.testing.assert_allclose(after[:2], table[[3, 700]] - 0.1, atol=1e-5)   # Adam: first step -lr*sign
        np.testing.assert_array_equal(after[2:], table[[4, 699]])              # untouched rows stay
        with pytest.raises(InvalidArgumentError, match=r"must be in \[0, 784\)"):
            ps.pull_rows("hidden/weights", [784])
    finally:
        for p in procs:
            p.stop()


def test_one_push_carries_a_tables_rows_with_the_dense_gradients_in_sync_mode(tmp_path, initial):
    """What a worker training a sparse embedding sends: the table's touched rows as IndexedSlices, each
    block to its shard (an empty block too, so every shard hears from every replica), the rest dense;
    the step completes once per replica and shard, and pulls that leave the table out do not carry it."""
    procs = shards(tmp_path, 2, "--max-shard-bytes", "160000", "--mode", "sync", "--replicas-to-aggregate", "2")
    try:
        placement = place(model_variables(MNIST_MLP), 2, max_shard_bytes=160000)
        replicas = [PsClient([p.endpoint for p in procs], placement) for _ in range(2)]
        replicas[0].initialize(initial)
        dense = {name: np.ones_like(v) for name, v in initial.items() if name != "hidden/weights"}
        for replica in replicas:
            params = replica.pull(exclude=["hidden/weights"])
            assert "hidden/weights" not in params and set(params) == set(dense)
        first = replicas[0].push({**dense, "hidden/weights": IndexedSlices(np.array([3]), np.ones((1, 100), np.float32))}, 0)
        assert not any(r["applied"] for r in first)   # waiting for replica 1 on both shards
        second = replicas[1].push({**dense, "hidden/weights": IndexedSlices(np.array([3, 700]),
                                                                            np.ones((2, 100), np.float32))}, 1)
        assert all(r["applied"] for r in second) and [s["version"] for s in replicas[1].stats()] == [1, 1]
        rows = replicas[0].pull_rows("hidden/weights", [3, 700, 4])
        table = initial["hidden/weights"]
        np.testing.assert_allclose(rows[0], table[3] - 0.5 * (1 + 1) / 2, rtol=1e-6)   # mean over the 2 replicas
        np.testing.assert_allclose(rows[1], table[700] - 0.5 * 1 / 2, rtol=1e-6)
        np.testing.assert_array_equal(rows[2], table[4])
        before = sum(s["bytes_pulled"] for s in replicas[0].stats())
        replicas[0].pull(exclude=["hidden/weights"])
        assert sum(s["bytes_pulled"] for s in replicas[0].stats()) - before == sum(v.nbytes for v in dense.values())
        with pytest.raises(InvalidArgumentError, match=r"cannot leave out \['nope'\]"):
            replicas[0].pull(exclude=["nope"])
    finally:
        for p in procs:
            p.stop()


def test_sync_waits_for_the_step_and_names_missing_replicas(tmp_path, initial):
    with sync_job(tmp_path, initial, total=3) as (a, b):
        grads = {k: np.zeros_like(v) for k, v in initial.items()}
        a.push(grads, replica=0)
        with pytest.raises(DeadlineExceededError, match=r"misses \[1, 2\]"):
            a.pull(min_version=1, timeout=0.3)  # the stall report names who is missing
        waiting = a.pull_async(min_version=1, timeout=10)
        b.push(grads, replica=2)  # the spare completes the step
        waiting.result()
        assert a.versions == [1]


def test_a_sync_push_with_min_version_answers_once_its_step_is_applied(tmp_path, initial):
    """A sync step's exchange in one round trip on two shards: each push answers with the variables once the
    step it is part of is applied (the average of both replicas' gradients); not before (the next test)."""
    with sync_job(tmp_path, initial, num_shards=2) as (a, b):
        ones = {k: np.ones_like(v) for k, v in initial.items()}
        threes = {k: 3 * np.ones_like(v) for k, v in initial.items()}
        first = a.push_async(ones, replica=0, pull=True, min_version=1, timeout=10)
        time.sleep(0.3)
        results, stepped = b.push_async(threes, replica=1, pull=True, min_version=[1, 1], timeout=10).result()
        assert [r["applied"] for r in results] == [True, True] and [r["version"] for r in results] == [1, 1]
        results, params = first.result()
        assert [(r["applied"], r["dropped"], r["released"]) for r in results] == [(False, False, False)] * 2
        assert a.versions == b.versions == [1, 1]
        for name, value in initial.items():   # SGD at 0.5 on the mean gradient, 2
            np.testing.assert_allclose(params[name], value - 1.0, rtol=1e-6)
            np.testing.assert_array_equal(params[name], stepped[name])


def test_a_sync_push_whose_step_does_not_come_fails_with_the_stall_report_and_still_counts(tmp_path, initial):
    with sync_job(tmp_path, initial) as (a, b):
        ones = {k: np.ones_like(v) for k, v in initial.items()}
        with pytest.raises(DeadlineExceededError, match=r"still at version 0 \(waiting for 1\).*misses \[1\]"):
            a.push_async(ones, replica=0, pull=True, min_version=1, timeout=0.3).result()
        b.push(ones, replica=1)   # completes the step: replica 0's push was held in its sums all along
        np.testing.assert_allclose(a.pull(min_version=1, timeout=5)["hidden/weights"], initial["hidden/weights"] - 0.5,
                                   rtol=1e-6)


def test_a_parked_sync_push_is_released_when_the_step_cannot_complete(tmp_path, initial):
    """The other replica finishes its input while a push waits for the step: answered at once, `released`,
    with the variables as they stand; a step that cannot complete answers the next push at once too."""
    with sync_job(tmp_path, initial) as (a, chief):
        ones = {k: np.ones_like(v) for k, v in initial.items()}
        waiting = a.push_async(ones, replica=0, pull=True, min_version=1, timeout=10)
        time.sleep(0.2)
        chief.worker_done(1)
        results, params = waiting.result()
        assert results[0]["released"] and results[0]["version"] == 0 and not results[0]["applied"]
        np.testing.assert_array_equal(params["hidden/weights"], initial["hidden/weights"])
        again = a.push_async(ones, replica=0, pull=True, min_version=1, timeout=10)
        assert again.result()[0][0]["released"]   # a step that cannot complete: answered at once


def test_workers_wait_until_the_chief_initialized(tmp_path, initial):
    procs = shards(tmp_path)
    try:
        worker, chief = client(procs, name="w"), client(procs, name="chief")
        with RpcClient(procs[0].endpoint) as raw:
            waiting = raw.submit("wait_ready", timeout=10)
            chief.initialize(initial)
            assert waiting.result()[0]["version"] == 0
        worker.wait_ready(timeout=2)
    finally:
        for p in procs:
            p.stop()


def test_checkpoint_from_two_shards_restores_onto_one(tmp_path, initial):
    ckpt = str(tmp_path / "ckpt")
    two = shards(tmp_path, 2)
    try:
        ps = client(two)
        ps.initialize(initial)
        ps.pull()
        ps.push({k: np.ones_like(v) for k, v in initial.items()})
        trained = ps.pull()
        path = ps.save(ckpt)
        assert os.path.basename(path) == "ckpt-1"
    finally:
        for p in two:
            p.stop()
    one = shards(tmp_path, 1, "--restore-from", ckpt)
    try:
        ps = client(one)
        restored = ps.pull()  # restored at start: no init needed
        assert ps.versions == [1]
        for name, value in trained.items():
            np.testing.assert_array_equal(restored[name], value)
    finally:
        for p in one:
            p.stop()


def test_ps_takes_index_count_and_address_from_tf_config(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1]]
    tf_config = {"cluster": {"ps": [f"127.0.0.1:{ports[0]}"], "worker": ["127.0.0.1:1"]},
                 "task": {"type": "ps", "index": 0}}
    proc = start_service("zmqflow.services.ps", ["--model", SPEC], bind="tcp://127.0.0.1:*",
                         env={"TF_CONFIG": json.dumps(tf_config)}, log_dir=str(tmp_path))
    try:
        assert proc.endpoint.endswith(f":{ports[0]}")
        assert "ps:0 of 1" in proc.log()
    finally:
        proc.stop()


def test_sync_wait_is_released_when_too_few_workers_are_left(tmp_path, initial):
    procs = shards(tmp_path, 1, "--mode", "sync", "--replicas-to-aggregate", "2", "--total-num-replicas", "2")
    try:
        a = client(procs, name="a")
        a.initialize(initial)
        a.pull()
        a.worker_done(1)  # replica 1 ran out of input
        a.push({k: np.zeros_like(v) for k, v in initial.items()}, replica=0)
        with RpcClient(procs[0].endpoint) as raw:
            result, _ = raw.call("pull", {"min_version": 1}, timeout=5)  # answered at once, not after 5 s
        assert result["released"] and result["version"] == 0
    finally:
        for p in procs:
            p.stop()


def test_a_worker_counted_lost_by_the_chief_releases_the_wait_and_can_still_report(tmp_path, initial):
    procs = shards(tmp_path, 1, "--mode", "sync", "--replicas-to-aggregate", "2", "--total-num-replicas", "3")
    try:
        a = client(procs, name="a")
        a.initialize(initial)
        a.worker_done(0)  # the chief ran out of input: 2 replicas left, a step still possible
        with RpcClient(procs[0].endpoint) as raw:
            parked = raw.submit("pull", {"min_version": 1}, timeout=10)  # replica 1 waits for a partner
            time.sleep(0.2)
            a.worker_done(2, lost=True)  # replica 2 went silent (killed): nobody can complete the step
            result, _ = parked.result()
            assert result["released"] and result["version"] == 0
            assert raw.call("stats")[0]["lost_workers"] == [2]
            a.worker_done(2)  # a worker taken for lost that reports after all is no longer lost
            stats = raw.call("stats")[0]
            assert stats["lost_workers"] == [] and stats["done_workers"] == [0, 2]
    finally:
        for p in procs:
            p.stop()


def test_shutdown_answers_parked_sync_waits(tmp_path, initial):
    procs = shards(tmp_path, 1, "--mode", "sync", "--replicas-to-aggregate", "2")
    try:
        a = client(procs, name="a")
        a.initialize(initial)
        with RpcClient(procs[0].endpoint) as raw:
            parked = raw.submit("pull", {"min_version": 1}, timeout=10)
            time.sleep(0.2)
            a.shutdown()
            result, _ = parked.result()
            assert result["released"]
        assert procs[0].proc.wait(10) == 0
    finally:
        for p in procs:
            p.stop()


def test_preloaded_data_is_held_once_and_sliced_by_row(tmp_path):
    from zmqflow.common.errors import InvalidArgumentError, NotFoundError
    procs = shards(tmp_path)
    try:
        ps, shard = client(procs), PsShardClient(procs[0].endpoint)
        x, y = np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10, dtype=np.int32)
        assert shard.preload("train", {"image": x, "label": y}) == {"rows": 10, "names": ["image", "label"]}
        assert ps.preloaded_rows("train") == 10
        got = ps.take_rows_async("train", [7, 2]).result()
        assert got["image"].tolist() == [[14, 15], [4, 5]] and got["label"].tolist() == [7, 2]
        with pytest.raises(InvalidArgumentError):
            ps.take_rows_async("train", [10]).result()
        with pytest.raises(NotFoundError):
            ps.take_rows_async("other", [0]).result()
        with pytest.raises(InvalidArgumentError):
            shard.preload("bad", {"a": x, "b": y[:3]})  # components of different lengths
    finally:
        for p in procs:
            p.stop()


def test_reader_preload_puts_a_data_set_on_the_ps(tmp_path):
    from zmqflow.services.reader.preload import PreloadedData, preload_to_ps
    procs = shards(tmp_path)
    try:
        data = PreloadedData({"x": np.ones((4, 3), np.float32), "y": np.arange(4, dtype=np.int32)})
        assert preload_to_ps(data, procs[0].endpoint, "small")["rows"] == 4
        assert client(procs).take_rows_async("small", [3]).result()["y"].tolist() == [3]
    finally:
        for p in procs:
            p.stop()


def test_elastic_join_admits_a_replica_at_the_same_step_on_every_shard_and_leave_releases_the_step(tmp_path, initial):
    """Elastic sync over two shards: a replica joining mid-step is admitted from the next step on both (ps 0
    picks it, ps 1 admits from it), its first push before that is dropped as not a member, and a member that
    leaves lets the step it held back complete with the others."""
    procs = shards(tmp_path, 2, "--mode", "sync", "--elastic", "--max-replicas", "3")
    try:
        replicas = [client(procs) for _ in range(3)]
        replicas[0].initialize(initial)
        grads = {k: np.ones_like(v) for k, v in initial.items()}
        assert replicas[0].join(0) == {"step": 0, "version": 0, "elastic": True}
        replicas[0].pull(min_version=0)
        replicas[1].pull()
        assert replicas[1].join(1)["step"] == 1                      # step 0 goes on without it
        assert [r["reason"] for r in replicas[1].push(grads, 1)] == ["not_member", "not_member"]
        assert all(r["applied"] for r in replicas[0].push(grads, 0))
        replicas[1].pull(min_version=1)
        replicas[0].pull(min_version=1)
        assert [s["members"] for s in replicas[0].stats()] == [[0, 1], [0, 1]]
        assert not any(r["applied"] for r in replicas[0].push(grads, 0))   # step 1 waits for replica 1 ...
        replicas[1].worker_done(1)                                          # ... which leaves instead
        stats = replicas[0].stats()
        assert [s["version"] for s in stats] == [2, 2] and [s["members"] for s in stats] == [[0], [0]]
        assert [s["steps_by_replicas"] for s in stats] == [{"1": 2}, {"1": 2}]
        with pytest.raises(InvalidArgumentError, match=r"in \[0, 3\) \(max_replicas\)"):
            replicas[2].join(3)
        # a shard past the step ps 0 picked (here: re-initialized at step 9) refuses it; the replica leaves the
        # shards that admitted it and asks again, then gives up naming the shard's step
        late = replicas[2]
        pieces = late._split(initial)
        late.clients[1].call(PsOps.Init(late.shard_keys[1], 9, True), tensors=[pieces[k] for k in late.shard_keys[1]])
        with pytest.raises(FailedPreconditionError, match="cannot join at step 3: this shard is at step 9 already"):
            late.join(2)
        assert [(s["members"], s["pending"]) for s in late.stats()] == [([0], {}), ([0], {})]
    finally:
        for p in procs:
            p.stop()
