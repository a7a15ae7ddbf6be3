"""Input limits every service enforces on what arrives from the network.

A message over a limit is answered INVALID_ARGUMENT naming the limit; the
socket-level cap (`socket_max_frame_bytes`) only protects memory from frames
far beyond it, which libzmq refuses by dropping the connection. The client
then names the limit itself: every ping answer carries max_message_bytes.
The broker's limits on queues and bytes are in services/broker/queues/quota.py.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 512 * 1024 * 1024
    max_frames: int = 1024
    max_header_bytes: int = 1024 * 1024
    max_name_length: int = 256
    max_rank: int = 32

    @property
    def socket_max_frame_bytes(self):
        return 2 * self.max_message_bytes


DEFAULT_LIMITS = Limits()
