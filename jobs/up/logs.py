"""Output of many processes in one stream, each line prefixed `name  | ` as docker compose does; each
service's lines also in a file of its own (`log_dir`/NAME.log, what `zmqflow logs` reads)."""

import collections
import os
import threading

COLORS = (36, 33, 32, 35, 34, 96, 93, 92, 95, 94)   # cyan, yellow, green, magenta, blue, then bright


class Prefixer:
    """Writes whole lines under a lock, so lines of different services never interleave."""

    def __init__(self, names, out, color=False, log_dir=None):
        self.width = max((len(n) for n in names), default=0)
        self.out, self.color, self.log_dir = out, color, log_dir
        self.files = {}
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
            if self.log_dir:
                if name not in self.files:
                    self.files[name] = open(os.path.join(self.log_dir, f"{name}.log"), "a", encoding="utf-8")
                self.files[name].write(text + "\n")
                self.files[name].flush()

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
