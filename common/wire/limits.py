"""Input limits every service enforces on what arrives from the network.

A message over a limit is answered INVALID_ARGUMENT naming the limit; the
socket-level cap (`socket_max_frame_bytes`) only protects memory from frames
far beyond it, which libzmq refuses by dropping the connection. The client
then names the limit itself: every ping answer carries max_message_bytes.
The broker's limits on queues and bytes are in services/broker/queues/quota.py.

What one peer may hold besides its messages (docs/security.md): `max_connections` connections to a
service, `handshake_timeout_ms` to finish the ZMTP handshake, `max_unread_reply_bytes` of replies it has
not read before its requests are refused, `max_parked_per_client` requests waiting in the service
(common/rpc/connections.py and service.py enforce them). An unfinished message may hold what one frame may:
`socket_max_frame_bytes`.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 512 * 1024 * 1024
    max_frames: int = 1024
    max_header_bytes: int = 1024 * 1024
    max_name_length: int = 256
    max_rank: int = 32
    max_connections: int = 1024
    handshake_timeout_ms: int = 5000
    max_unread_reply_bytes: int = 256 * 1024 * 1024
    max_parked_per_client: int = 10_000

    @property
    def socket_max_frame_bytes(self):
        return 2 * self.max_message_bytes


DEFAULT_LIMITS = Limits()
