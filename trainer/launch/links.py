"""The links that keep the launchers of a job together once they met at the rendezvous (`rendezvous.py`).

Node 0 holds a `Hub` of every other node's connection; each other node a
`NodeLink` to node 0; a launcher on one machine an `Alone`. Each tells the
supervising loop (`supervise.py`) of a stop elsewhere, tells the others of its
own, and after a stop says whether the job starts again (`rejoin`). Messages
are JSON, one per line (`Channel`). Pure Python: no TensorFlow here.
"""

from __future__ import annotations

import json
import select
import socket
import time

TICK = 0.5  # seconds between looks at the stop requests while waiting
VERDICT_SECONDS = 40.0  # how long a stopped node waits for node 0 to say whether the job restarts


class Channel:
    """One end of a launcher-to-launcher connection: JSON messages, one per line."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buffer = b""

    def send(self, message: dict) -> None:
        try:
            self.sock.sendall((json.dumps(message) + "\n").encode())
        except OSError:
            pass  # the other end is gone: its side finds out from the closed connection

    def receive(self, timeout: float) -> dict | None:
        """The next message, waiting up to `timeout` seconds; None if none came.

        Raises:
          ConnectionError: the other end closed the connection (or it broke).
        """
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError:
            raise ConnectionError(f"not a launcher's message: {line[:80]!r}") from None
        if not isinstance(message, dict):
            raise ConnectionError(f"not a launcher's message: {line[:80]!r}")
        return message

    def close(self) -> None:
        self.sock.close()


class Alone:
    """The link of a launcher on one machine: no other node to hear from or tell. `rejoin` says whether the
    tasks start again (a failure while restarts are left)."""

    def __init__(self, can_restart: bool = False):
        self.can_restart = can_restart
        self.rejoin, self.why = False, ""

    def poll(self) -> tuple[int, str] | None:
        return None

    def stopping(self, status: int, why: str, leaving: bool = False) -> None:
        self.rejoin, self.why = self.can_restart and not leaving, why

    def finish(self, status: int) -> int:
        return status


class NodeLink:
    """Node r > 0's link to node 0: hears stops from it, tells it of its own. After a stop, `rejoin` says
    whether node 0 restarts the job (this node then meets it at the rendezvous again)."""

    def __init__(self, channel: Channel, rank: int):
        self.channel, self.rank = channel, rank
        self.rejoin, self.why, self.leaving = False, "", False
        self._verdict: bool | None = None

    def poll(self) -> tuple[int, str] | None:
        try:
            message = self.channel.receive(0)
        except ConnectionError:
            self._verdict, self.why = False, "node 0's launcher is gone (its machine stopped, or it was killed)"
            return 1, self.why
        if message is not None and "stop" in message:
            self._verdict, self.why = bool(message.get("rejoin")), str(message.get("why", "node 0 stopped the job"))
            return int(message["stop"]), self.why
        return None

    def stopping(self, status: int, why: str, leaving: bool = False) -> None:
        self.leaving, self.why = leaving, why
        self.channel.send({"stop": status, "why": f"node {self.rank}: {why}", "leaving": leaving})

    def finish(self, status: int) -> int:
        if status == 0:
            self.channel.send({"done": True})
        elif not self.leaving:  # node 0 says whether the job restarts (after stopping its own tasks)
            deadline = time.monotonic() + VERDICT_SECONDS
            while self._verdict is None and time.monotonic() < deadline:
                try:
                    message = self.channel.receive(TICK)
                except ConnectionError:
                    break
                if message is not None and "rejoin" in message:
                    self._verdict = bool(message["rejoin"])
            self.rejoin = bool(self._verdict)
        self.channel.close()
        return status


class Hub:
    """Node 0's links to every other node: relays a stop from one node to the others, with whether the job
    restarts (`can_restart`, and the stop not an interruption of node 0)."""

    def __init__(self, channels: dict[int, Channel], servers_only: bool, can_restart: bool = False):
        self.channels = channels
        self.servers_only = servers_only  # the other nodes only serve (parameter-server training)
        self.can_restart = can_restart
        self.done: set[int] = set()
        self.rejoin, self.why = False, ""

    def poll(self) -> tuple[int, str] | None:
        for rank, channel in self.channels.items():
            if rank in self.done:
                continue
            try:
                message = channel.receive(0)
            except ConnectionError:
                return self._relay(1, f"node {rank}'s launcher is gone (its machine stopped, or it was killed)", rank)
            if message is None:
                continue
            if "done" in message:
                self.done.add(rank)
            elif "stop" in message:
                return self._relay(int(message["stop"]), str(message.get("why", f"node {rank} stopped")), rank)
        return None

    def _relay(self, status: int, why: str, source: int) -> tuple[int, str]:
        """Tells every node of the stop (the source too: whether it rejoins)."""
        self.done.add(source)
        self.rejoin, self.why = self.can_restart, why
        for channel in self.channels.values():
            channel.send({"stop": status, "why": why, "rejoin": self.rejoin})
        return status, why

    def stopping(self, status: int, why: str, leaving: bool = False) -> None:
        self.rejoin, self.why = self.can_restart and not leaving, f"node 0: {why}"
        for channel in self.channels.values():
            channel.send({"stop": status, "why": self.why, "rejoin": self.rejoin})

    def finish(self, status: int, poll_seconds: float = 0.1) -> int:
        """Node 0's own tasks are done with `status`: with 0, waits for every node to finish (telling
        serving nodes to stop first); returns the job's status."""
        if status == 0 and self.servers_only:
            for channel in self.channels.values():
                channel.send({"stop": 0, "why": "node 0: the chief finished"})
        while status == 0 and len(self.done) < len(self.channels):
            news = self.poll()
            if news is not None:
                status = news[0]
            time.sleep(poll_seconds)
        for channel in self.channels.values():
            channel.close()
        return status
