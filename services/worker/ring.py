"""Ring all-reduce's arithmetic, apart from any socket: which chunk each rank sends and adds when.

The flattened gradient of every rank is cut into n near-equal chunks (n ranks on a ring, each sending
to the next and receiving from the previous). Reduce-scatter: in exchange s = 0..n-2, rank r sends
chunk (r - s) mod n and adds the chunk it receives into chunk (r - s - 1) mod n; after n - 1 exchanges
rank r holds the whole sum of chunk (r + 1) mod n. All-gather: in exchange s, rank r sends chunk
(r + 1 - s) mod n and overwrites chunk (r - s) mod n with the one it receives; after n - 1 more every
rank holds every summed chunk. Each rank sends 2 (n - 1) / n of the buffer, whatever n (Baidu's ring,
as Horovod and NCCL run it). Every element of the result is computed once, by one rank, and copied to
the others byte for byte: the replicas' sums are bit-identical, which keeps their variables identical.

`all_reduce` is a generator, so a transport (services/worker/ring_link.py) or a test drives it: it
yields each outgoing chunk and is sent the chunk that came from the previous rank. A yielded chunk is a
view of the buffer, and a transport may send it without a copy: a chunk sent in reduce-scatter is only
overwritten in all-gather by its summed value, which the ring computes from that very message, so the
message has arrived by then; a chunk sent in all-gather is never written again. What is still in flight
when the call ends reads the buffer, so the caller does not write it afterwards (a new buffer per step).
`pack`/`unpack` flatten a step's gradients, weighted by the rows each rank trained on, with the rows
and a stop vote as two more elements, so the one reduction also agrees on the step's batch and its end.
"""

import numpy as np

from zmqflow.common.errors import InvalidArgumentError


def chunk_bounds(size, ranks):
    """The n + 1 boundaries of `ranks` near-equal chunks of `size` elements (the first `size % ranks`
    one longer; chunks are empty when size < ranks)."""
    if ranks < 1:
        raise InvalidArgumentError(f"a ring needs at least one rank, got {ranks}")
    base, extra = divmod(int(size), ranks)
    bounds = [0]
    for i in range(ranks):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


def reduce_scatter_chunks(rank, ranks, exchange):
    """(chunk sent, chunk received and added) in reduce-scatter exchange `exchange` (0..ranks-2)."""
    return (rank - exchange) % ranks, (rank - exchange - 1) % ranks


def all_gather_chunks(rank, ranks, exchange):
    """(chunk sent, chunk received and kept) in all-gather exchange `exchange` (0..ranks-2)."""
    return (rank + 1 - exchange) % ranks, (rank - exchange) % ranks


def exchanges(ranks):
    """How many chunks each rank sends (and receives) in one all-reduce: 2 (n - 1)."""
    return 2 * (ranks - 1)


def all_reduce(buffer, rank, ranks):
    """Sum `buffer` (a flat, writable array) in place over the ring: yields each chunk to send to rank + 1,
    is sent each chunk from rank - 1 (same dtype and length as the one it replaces). Nothing to exchange
    for one rank."""
    if buffer.ndim != 1:
        raise InvalidArgumentError(f"all_reduce sums a flat buffer, got shape {list(buffer.shape)}")
    if not 0 <= rank < ranks:
        raise InvalidArgumentError(f"rank {rank} is not in [0, {ranks})")
    bounds = chunk_bounds(buffer.size, ranks)

    def chunk(c):
        return buffer[bounds[c]:bounds[c + 1]]

    for s in range(ranks - 1):
        send, add = reduce_scatter_chunks(rank, ranks, s)
        incoming = yield chunk(send)
        target = chunk(add)
        _check_incoming(incoming, target)
        np.add(target, incoming, out=target)
    for s in range(ranks - 1):
        send, keep = all_gather_chunks(rank, ranks, s)
        incoming = yield chunk(send)
        target = chunk(keep)
        _check_incoming(incoming, target)
        target[...] = incoming


def _check_incoming(incoming, target):
    if incoming is None or incoming.shape != target.shape or incoming.dtype != target.dtype:
        got = "nothing" if incoming is None else f"{incoming.dtype} {list(incoming.shape)}"
        raise InvalidArgumentError(f"ring all-reduce: expected a chunk of {target.dtype} {list(target.shape)} "
                                   f"from the previous rank, got {got}")


# --- one step's message: weighted gradients, rows, stop vote ------------------------------------------------

EXTRAS = 2
"""Elements after the gradients in a packed buffer: the rows the rank trained on, and its stop vote."""


def pack(names, grads, rows, stop=False, dtype=np.float32):
    """One flat buffer: each gradient of `names` (in that order) times `rows`, then rows, then 1 for a stop
    vote. A rank without a batch packs zero gradients with rows 0: it counts for nothing in the mean."""
    sizes = [int(np.prod(np.shape(grads[n]))) for n in names]
    dtype = np.dtype(dtype)
    buffer = np.empty(sum(sizes) + EXTRAS, dtype)
    offset = 0
    for name, size in zip(names, sizes):
        np.multiply(np.asarray(grads[name], dtype).reshape(-1), dtype.type(rows), out=buffer[offset:offset + size])
        offset += size
    buffer[offset], buffer[offset + 1] = rows, 1 if stop else 0
    return buffer


def unpack(buffer, names, shapes, dtypes):
    """({name: the rows-weighted mean gradient}, total rows, stop voted by any rank) of a summed buffer; the
    gradients are empty when no rank had rows (the end of every rank's input)."""
    rows, stop = int(round(float(buffer[-2]))), float(buffer[-1]) > 0
    if rows == 0:
        return {}, 0, stop
    mean = buffer[:-EXTRAS] / buffer.dtype.type(rows)
    out, offset = {}, 0
    for name in names:
        size = int(np.prod(shapes[name]))
        out[name] = mean[offset:offset + size].reshape(shapes[name]).astype(dtypes[name], copy=False)
        offset += size
    return out, rows, stop
