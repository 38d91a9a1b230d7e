"""TensorFlow's start-up notices, kept off the screen of the example, the notebook and launched tasks.

`startup_notices_hidden()` drops, while TensorFlow starts, the lines of the process's stderr that say nothing
about the user's job; every other line (a real warning or error) must pass, and a `TF_CPP_MIN_LOG_LEVEL` the
user set turns it off. It imports nothing of the trainer. Which notices: docs/multi_worker.md, "A quiet start".
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from typing import Iterator

# TensorFlow's C++ log records, in absl's format (2.21: "I0000 00:00:1795636001.471757   31607 port.cc:153] ...")
# and its older one (2.18: "2026-11-25 17:56:48.268968: E external/local_xla/.../cuda_fft.cc:477] ..."):
# the severity, and the message.
_RECORD = re.compile(r"^(?:([IWE])\d{4} [\d:.]+\s+\d+ |\S+ [\d:.]+: ([IWE]) )\S*?\.(?:cc|h):\d+\] (.*)")
# The warnings and errors that are start-up notices too: cuInit failing on a machine without a GPU, CUDA
# plug-ins registered twice, the CPU features the wheel was not built for. Any other (a CUDA error on a GPU
# machine, an out-of-memory) is news and passes.
_STARTUP_MESSAGES = re.compile(r"failed call to cuInit|Unable to register cu\w+ factory|"
                               r"This TensorFlow binary is optimized")
_LINES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "WARNING: Logging before InitGoogle() is written to STDERR",
    "To enable the following instructions:",  # the second line of cpu_feature_guard's notice
)
_TASK = re.compile(r"^/job:[\w-]+/replica:\d+/task:\d+$")  # the lines that list a notice's waiting tasks
# TensorFlow 2.22 follows an error record with where it came from: "=== Source Location Trace: ===", then
# lines such as "external/xla/xla/stream_executor/cuda/cuda_status.cc:50", then a blank line.
_TRACE = re.compile(r"^=== Source Location Trace: ===\s*$|^[\w/.-]+\.(?:cc|h):\d+$|^$")


def is_startup_notice(line: str) -> bool:
    """Whether a line of stderr is one of TensorFlow's start-up notices: any of its C++ INFO records (a
    cluster connecting, tf.data pinning glibc's malloc settings, ...), one of the start-up warnings and
    errors above, or one of absl's and TensorFlow's fixed start-up lines."""
    record = _RECORD.match(line)
    if record is None:
        return line.startswith(_LINES)
    severity = record.group(1) or record.group(2)
    return severity == "I" or bool(_STARTUP_MESSAGES.match(record.group(3)))


class NoticeFilter:
    """`passes(line)`: False for TensorFlow's start-up notices and the task lists and source traces that follow
    one."""

    def __init__(self):
        self._dropped = False

    def passes(self, line: str) -> bool:
        text = line.rstrip("\n")
        drop = is_startup_notice(text) or (self._dropped and (bool(_TASK.match(text) or _TRACE.match(text))
                                                              or text == "Example stragglers:"))
        self._dropped = drop
        return not drop


def user_chose_logs(env: dict | os._Environ | None = None) -> bool:
    """Whether the user set TensorFlow's log level themselves (then nothing is hidden)."""
    return "TF_CPP_MIN_LOG_LEVEL" in (os.environ if env is None else env)


@contextlib.contextmanager
def startup_notices_hidden() -> Iterator[None]:
    """While the body runs (import TensorFlow, create the strategy), TensorFlow's start-up notices on this
    process's stderr are dropped and every other line passes through; stderr is as before afterwards."""
    if user_chose_logs():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    # The thread writes to a copy of the real stderr that it closes itself: it may outlive the block.
    thread = threading.Thread(target=_pass_on, args=(read_end, os.dup(saved)), name="startup-notices", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer closes: the thread reads to the end and stops
        os.close(saved)
        thread.join(timeout=5)  # a child started meanwhile may hold the pipe: then its lines keep flowing


def _pass_on(read_end: int, out: int) -> None:
    notices = NoticeFilter()
    with os.fdopen(read_end, "rb", buffering=0) as pipe, os.fdopen(out, "wb", buffering=0) as stream:
        pending = b""
        while chunk := pipe.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if notices.passes(line.decode("utf-8", "replace")):
                    stream.write(line + b"\n")
        if pending and notices.passes(pending.decode("utf-8", "replace")):
            stream.write(pending)
