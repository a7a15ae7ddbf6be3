"""Output of many processes in one stream, each line prefixed `name  | ` as docker compose does."""

import collections
import threading

COLORS = (36, 33, 32, 35, 34, 96, 93, 92, 95, 94)   # cyan, yellow, green, magenta, blue, then bright


class Prefixer:
    """Writes whole lines under a lock, so lines of different services never interleave."""

    def __init__(self, names, out, color=False):
        self.width = max((len(n) for n in names), default=0)
        self.out, self.color = out, color
        self.colors = {name: COLORS[i % len(COLORS)] for i, name in enumerate(names)}
        self.tails = {name: collections.deque(maxlen=12) for name in names}   # each service's last lines
        self.lock = threading.Lock()

    def prefix(self, name):
        text = f"{name:<{self.width}}  | "
        return f"\x1b[{self.colors.get(name, 0)}m{text}\x1b[0m" if self.color else text

    def line(self, name, text):
        text = text.rstrip("\r\n")
        with self.lock:
            self.tails.setdefault(name, collections.deque(maxlen=12)).append(text)
            self.out.write(self.prefix(name) + text + "\n")
            self.out.flush()

    def tail(self, name):
        """The last lines `name` wrote (at most 12), for the message that says why the run ended."""
        with self.lock:
            return list(self.tails.get(name, ()))

    def note(self, text):
        """A message of `zmqflow up` itself."""
        with self.lock:
            self.out.write(text + "\n")
            self.out.flush()

    def follow(self, name, stream):
        """A daemon thread copying `stream` (bytes, line by line) until it closes."""
        def pump():
            for raw in iter(stream.readline, b""):
                self.line(name, raw.decode("utf-8", "replace"))
            stream.close()
        thread = threading.Thread(target=pump, name=f"logs-{name}", daemon=True)
        thread.start()
        return thread
