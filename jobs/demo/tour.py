"""`make demo`, part 0: MNIST through a real queue-broker (the queue tour).

It starts a broker process on a free loopback port, cuts the MNIST CSV (sorted
by label) into 20 "files" handed in a shuffled order to two producer threads
that enqueue_many into a RandomShuffleQueue, closes the queue once both finished (a coordinated close),
and drains it with two consumers using dequeue_up_to until OutOfRange. It
prints the queue table a user would see with `zmqflow queues`, the label mix
of the first mini-batches (shuffled although the file is sorted), and the
throughput. The rest of the story (training, sweep, ensemble, load test) is
jobs/demo/story.py.
"""

import os
import threading
import time
from collections import Counter

import click
import numpy as np
from tqdm import tqdm

from zmqflow.inputs.datasets import MNIST_CSV, load_mnist
from zmqflow.common.errors import OutOfRangeError
from zmqflow.common.processes.children import start_service
from zmqflow.common.clients.queues import RandomShuffleQueue
from zmqflow.jobs.status.render import queue_table
from zmqflow.common.clients.broker import BrokerClient



def run_demo(batch=100, producers=2, consumers=2):
    images, labels = load_mnist()
    click.echo(f"loaded {len(labels)} MNIST rows from {os.path.relpath(MNIST_CSV)} (sorted by label)")
    broker = start_service("zmqflow.services.broker")
    click.echo(f"broker pid {broker.pid} at {broker.endpoint}")
    try:
        q = RandomShuffleQueue(capacity=2000, min_after_dequeue=1000, dtypes=["float32", "int32"],
                               shapes=[[784], []], names=["image", "label"], seed=1, shared_name="mnist",
                               broker=broker.endpoint)
        batches, errors = [], []
        progress = tqdm(total=len(labels), desc="consumed", unit="img", leave=True)

        # 20 contiguous "files" of 250 rows, each holding one label, read in a shuffled
        # order as string_input_producer(shuffle=True) would hand them to the readers
        files = np.array_split(np.arange(len(labels)), 20)
        order = np.random.default_rng(0).permutation(len(files))

        def produce(reader):
            for f in order[reader::producers]:
                idx = files[f]
                q.enqueue_many({"image": images[idx], "label": labels[idx]}, timeout=30)

        def consume():
            try:
                while True:
                    out = q.dequeue_up_to(batch, timeout=30)
                    batches.append(out["label"])
                    progress.update(len(out["label"]))
            except OutOfRangeError:
                return
            except Exception as exc:
                errors.append(exc)

        start = time.perf_counter()
        workers = [threading.Thread(target=produce, args=(s,)) for s in range(producers)]
        readers = [threading.Thread(target=consume) for _ in range(consumers)]
        for t in workers + readers:
            t.start()
        for t in workers:
            t.join(60)
        q.close()  # only after every producer finished: no instance lost
        for t in readers:
            t.join(60)
        elapsed = time.perf_counter() - start
        progress.close()
        if errors:
            raise errors[0]
        seen = np.concatenate(batches)
        first = Counter(np.concatenate(batches[:3]).tolist())
        click.echo(f"\nfirst 3 mini-batches: {len(first)} distinct labels, counts {dict(sorted(first.items()))}")
        click.echo(f"delivered {len(seen)} of {len(labels)} instances exactly once: "
                   f"{sorted(seen.tolist()) == sorted(labels.tolist())}")
        click.echo(f"{len(seen) / elapsed:,.0f} instances/s through the broker "
                   f"({len(seen) * 785 * 4 / elapsed / 1e6:.1f} MB/s), then OutOfRange for every consumer")
        with BrokerClient(broker.endpoint) as client:
            click.echo("\n$ zmqflow queues --address " + broker.endpoint)
            click.echo(queue_table(client.list_queues()))
    finally:
        code = broker.stop()
        click.echo(f"broker stopped (exit {code})")


if __name__ == "__main__":
    run_demo()

