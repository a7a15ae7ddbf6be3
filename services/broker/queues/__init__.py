"""TensorFlow 1.x queues as plain Python: the queue-broker's domain logic, no sockets.

The server turns each request into a `Ticket`, calls `QueueBase.submit` /
`cancel` on the queue the `QueueRegistry` gives it, and replies to every
ticket those calls return. docs/queue-semantics.md is the specification; leases.py
adds at-least-once dequeues (docs/queues.md), producers.py a queue's registered producers (§8).
"""

from zmqflow.services.broker.queues.base import QueueBase
from zmqflow.services.broker.queues.declaration import KINDS, QueueDeclaration
from zmqflow.services.broker.queues.fifo import FIFOQueue
from zmqflow.services.broker.queues.padding_fifo import PaddingFIFOQueue
from zmqflow.services.broker.queues.random_shuffle import RandomShuffleQueue
from zmqflow.services.broker.queues.registry import QUEUE_CLASSES, QueueRegistry
from zmqflow.services.broker.queues.ticket import Ticket

__all__ = ["KINDS", "QUEUE_CLASSES", "FIFOQueue", "PaddingFIFOQueue", "QueueBase", "QueueDeclaration",
           "QueueRegistry", "RandomShuffleQueue", "Ticket"]
