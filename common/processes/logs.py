"""Log lines every task writes the same way: the task (`ps:1`, `worker:0`) in every line.

`text`: `time LEVEL [task] logger: message`; the lines of a multi-line message or a
traceback are prefixed with `[task] |` so grepping by task finds them all.
`json`: one JSON object per line (time, level, task, logger, message, and `exception`
with the traceback's text), for log shippers. Chosen with `--log-format` or
ZMQFLOW_LOG_FORMAT (which child processes inherit).
"""

import datetime
import json
import logging
import os
import sys

ENV = "ZMQFLOW_LOG_FORMAT"
FORMATS = ("text", "json")


class TextFormatter(logging.Formatter):
    def __init__(self, task):
        super().__init__(f"%(asctime)s %(levelname)s [{task}] %(name)s: %(message)s")
        self.continuation = f"\n[{task}] | "

    def format(self, record):
        return super().format(record).replace("\n", self.continuation)


class JsonFormatter(logging.Formatter):
    def __init__(self, task):
        super().__init__()
        self.task = task

    def format(self, record):
        event = {"time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
                 .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                 "level": record.levelname, "task": self.task, "logger": record.name,
                 "message": record.getMessage()}
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            event["exception"] = record.exc_text
        if record.stack_info:
            event["stack"] = self.formatStack(record.stack_info)
        return json.dumps(event, default=str)


def log_format():
    value = os.environ.get(ENV, "text") or "text"
    return value if value in FORMATS else "text"


def set_format(value):
    """Use `value` in this process and in the processes it starts."""
    if value not in FORMATS:
        raise ValueError(f"log format {value!r} is not one of {', '.join(FORMATS)}")
    os.environ[ENV] = value


def setup(level, task, fmt=None):
    """Log to stderr at `level`, every line naming `task`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter((JsonFormatter if (fmt or log_format()) == "json" else TextFormatter)(task))
    logging.basicConfig(level=level, handlers=[handler])
