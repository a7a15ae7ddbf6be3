"""A reader opens only the files of its own list (its globs, expanded at start).

Any broker client can enqueue into a pipeline's file-name queue (`QUEUE.filenames`). A raw client puts
hostile names there while a real reader process runs: a 0600 file outside the glob, `../` out of the
glob's folder, a symlink made inside the glob after the start, a matched symlink retargeted outside. Each
is refused before it is opened: the pipeline fails with PermissionDenied naming it, the reader logs it,
nothing of the file reaches the instance queue, for every format. A legitimate run delivers every record.
"""

import json
import os
import threading
import time

import numpy as np
import pytest

from zmqflow.common.clients import queues
from zmqflow.common.errors import OutOfRangeError, PermissionDeniedError
from zmqflow.inputs.formats import write_tfrecord
from zmqflow.jobs.local_cluster import start_readers
from zmqflow.services.reader.producer import ReaderFiles, filename_queue
from tests.reader.test_reader_processes import wait_for_state

pytestmark = pytest.mark.service

ROWS, FILES, SECRET_ROWS, SECRET_TAG = 50, 4, 7, 1517
FIXED = {"record_bytes": 8, "fields": [["id", "int32", 0], ["tag", "int32", 4]], "chunk_size": 10}
CSV = {"record_defaults": [[0], [0]], "columns": {"id": 0, "tag": 1}, "chunk_size": 10}
TFRECORD = {"features": {"id": {"shape": [], "dtype": "int64"}, "tag": {"shape": [], "dtype": "int64"}},
            "chunk_size": 10}


def rows(first, count, tag):
    return np.stack([np.arange(first, first + count), np.full(count, tag)], axis=1).astype(np.int32)


def write(path, kind, table):
    """`table` ([n, 2]: id, tag) as a file of `kind`."""
    if kind == "fixed_length":
        path.write_bytes(table.tobytes())
    elif kind == "csv":
        path.write_text("".join(f"{i},{t}\n" for i, t in table))
    else:
        write_tfrecord(str(path), [{"id": int(i), "tag": int(t)} for i, t in table])


def dataset(tmp_path, kind):
    """FILES shards of ROWS records (tag 1) in data/, the glob over them, and a 0600 file outside it whose
    SECRET_ROWS records carry SECRET_TAG: (glob, secret path)."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    data.mkdir()
    outside.mkdir()
    for i in range(FILES):
        write(data / f"shard-{i}.rec", kind, rows(i * ROWS, ROWS, 1))
    secret = outside / "secret.rec"
    write(secret, kind, rows(10_000, SECRET_ROWS, SECRET_TAG))
    os.chmod(secret, 0o600)
    return str(data / "shard-*.rec"), str(secret)


def reader(broker, processes, queue, pattern, kind, options, **extra):
    """One real reader process, one reader thread, on a FIFO instance queue."""
    options = {"files": [pattern], "format_kind": kind, "format_options": json.dumps(options), "queue": queue,
               "queue_kind": "fifo", "capacity": 30, "readers": 1, "progress_every": 0, "heartbeat_timeout_secs": 2.0,
               "shuffle_files": False, **extra}
    [proc] = start_readers(broker, processes=1, log_dir=processes.log_dir, stats_dir=processes.log_dir, **options)
    return processes.adopt(proc)


def drain(queue, limit_s=60):
    """Every record until the queue ends, or a record of the secret file came: ({"id", "tag"} arrays, the
    PermissionDenied that ended it or None). Bounded: `limit_s` in all."""
    got, error, deadline = [], None, time.monotonic() + limit_s
    try:
        while not got or SECRET_TAG not in got[-1]["tag"]:
            left = deadline - time.monotonic()
            assert left > 0, f"the queue did not end within {limit_s} s"
            got.append(queue.dequeue_up_to(25, timeout=left))
    except OutOfRangeError:
        pass
    except PermissionDeniedError as exc:
        error = exc
    return {k: np.concatenate([b[k] for b in got]) if got else np.empty(0) for k in ("id", "tag")}, error


HOSTILE = {
    "0600 file outside the glob": lambda data, secret: secret,
    "../ out of the glob's folder": lambda data, secret: os.path.join(data, "..", "outside", "secret.rec"),
    "symlink made inside the glob after the start": lambda data, secret: _link(data, "shard-9.rec", secret),
    "matched symlink retargeted outside": lambda data, secret: _link(data, "shard-link.rec", secret),
}


def _link(data, name, target):
    path = os.path.join(data, name)
    if os.path.lexists(path):
        os.remove(path)
    os.symlink(target, path)
    return path


@pytest.mark.parametrize("how", sorted(HOSTILE))
def test_hostile_file_names_are_refused_and_nothing_of_the_file_is_read(broker, processes, tmp_path, how):
    pattern, secret = dataset(tmp_path, "fixed_length")
    data = os.path.dirname(pattern)
    os.symlink(os.path.join(data, "shard-0.rec"), os.path.join(data, "shard-link.rec"))   # matched at start
    queue_name = f"paths-{sorted(HOSTILE).index(how)}"
    proc = reader(broker, processes, queue_name, pattern, "fixed_length", FIXED, num_epochs=0)   # forever
    instances = queues.attach(queue_name, broker=broker, timeout=30)
    wait_for_state(broker, queue_name, lambda s: len(s["producers"]) == 1)   # registered: its list is expanded
    name = HOSTILE[how](data, secret)   # made now: after the reader expanded its globs
    names = filename_queue(broker, queue_name + ".filenames")   # the raw client: any broker client can
    attacker = threading.Thread(target=names.enqueue, args=(name.encode(),), kwargs={"timeout": 30})
    attacker.start()   # waits for room: the reader's own producer keeps the queue full
    got, error = drain(instances)
    attacker.join(30)
    assert error is not None, "the pipeline was not failed"
    assert f"file name {name!r} from '{queue_name}.filenames' is not one of the 5 files" in str(error)
    assert SECRET_TAG not in got["tag"] and not np.isin(got["id"], range(10_000, 10_000 + SECRET_ROWS)).any()
    assert set(got["tag"].tolist()) <= {1}   # own records only (none, when the hostile name was taken first)
    assert proc.proc.wait(30) == 1
    assert "refused a file name" in proc.log() and repr(name) in proc.log()
    summary = json.loads((tmp_path / "reader-0.json").read_text())
    assert summary["outcome"] == "failed" and f"file name {name!r}" in summary["error"]
    assert summary["records_read"] == ROWS * summary["files_done"]   # whole files of its own list, no more


@pytest.mark.parametrize("kind, options", [("csv", CSV), ("tfrecord", TFRECORD), ("fixed_length", FIXED)])
def test_every_format_refuses_the_same_way_and_a_legitimate_run_delivers_every_record(broker, processes, tmp_path,
                                                                                      kind, options):
    pattern, secret = dataset(tmp_path, kind)
    legit = reader(broker, processes, f"legit-{kind}", pattern, kind, options, num_epochs=2)
    got, error = drain(queues.attach(f"legit-{kind}", broker=broker, timeout=30))
    assert error is None and legit.proc.wait(30) == 0, legit.log()[-2000:]
    assert sorted(got["id"].tolist()) == sorted(list(range(FILES * ROWS)) * 2)

    names = filename_queue(broker, f"attacked-{kind}.filenames")   # the attacker's name is in first
    names.enqueue(secret.encode(), timeout=5)
    proc = reader(broker, processes, f"attacked-{kind}", pattern, kind, options, num_epochs=1)
    got, error = drain(queues.attach(f"attacked-{kind}", broker=broker, timeout=30))
    assert isinstance(error, PermissionDeniedError) and repr(secret) in str(error), error
    assert len(got["id"]) == 0
    assert proc.proc.wait(30) == 1 and "refused a file name" in proc.log()


def test_a_data_spec_reader_refuses_names_outside_its_spec_files(broker, processes, tmp_path):
    from tests.inputs.test_spec_stream import write_parts
    from tests.reader.test_spec_readers import config_file
    write_parts(tmp_path, parts=2, rows=20)
    data_config, _, _ = config_file(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "part-9.csv"
    secret.write_text((tmp_path / "part-0.csv").read_text())
    os.chmod(secret, 0o600)
    filename_queue(broker, "spec-attacked.filenames").enqueue(str(secret).encode(), timeout=5)
    proc = processes.adopt(start_readers(broker, processes=1, log_dir=processes.log_dir, data_config=data_config,
                                         queue="spec-attacked", queue_kind="fifo", progress_every=0)[0])
    instances = queues.attach("spec-attacked", broker=broker, timeout=30)
    with pytest.raises(PermissionDeniedError, match=r"is not one of the 2 files this reader was given"):
        instances.dequeue(timeout=30)
    assert proc.proc.wait(30) == 1


def test_a_name_is_accepted_only_when_it_resolves_to_a_listed_file(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "a.rec").write_bytes(b"x")
    listed = str(tmp_path / "data" / "b.rec")
    open(listed, "wb").close()
    files = ReaderFiles([listed])
    other_spelling = os.path.join(str(tmp_path), ".", "data", "..", "data", "b.rec")
    assert files.resolve(other_spelling.encode(), "q.filenames") == listed   # the list's own path is opened
    for name in (str(tmp_path / "a.rec").encode(), b"/etc/passwd", b"data/b.rec\0x", b"\xff\xfe", b"x" * 5000,
                 os.path.join(os.path.dirname(listed), "..", "a.rec").encode()):
        with pytest.raises(PermissionDeniedError, match=r"from 'q.filenames' is not one of the 1 files"):
            files.resolve(name, "q.filenames")
