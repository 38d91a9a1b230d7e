"""Several machines without a scheduler: node 0's rendezvous, and the links that keep the launchers together.

    # on every machine, with its own --node-rank:
    trainer-launch --nnodes 2 --node-rank 0 --master-addr host0 --master-port 29400 train.py [args]

Node 0 serves the rendezvous at `--master-addr:--master-port`. Every other node
connects and says how many tasks it runs and on which free ports; once all
have arrived, node 0 sends each node the same cluster and that node's tasks,
so every task gets the same full TF_CONFIG. Every node presents the job's
shared secret (`TRAINER_RDZV_SECRET`, or a file): node 0 challenges each node
that connects, and a node checks node 0's answer the same way, so the secret
never crosses the network and a node with another secret is refused and named
before anything starts. The connections then stay open for
the whole job: a node whose task fails, or which is interrupted, says so and
node 0 tells the others to stop with its status; a connection that drops is a
node gone, and the others stop too. Pure Python: no TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import select
import socket
import time

DEFAULT_MASTER_PORT = 29400
DEFAULT_TIMEOUT = 300.0  # seconds for every node to arrive
SECRET_ENV = "TRAINER_RDZV_SECRET"  # the job's shared secret, unless --rdzv-secret-file names a file


class RendezvousError(RuntimeError):
    """The nodes could not agree on a cluster; the message says which node and what to do."""


class Interrupted(RendezvousError):
    """Ctrl-C or SIGTERM before every node had arrived."""


_TICK = 0.5  # seconds between looks at the stop requests while waiting


def read_secret(path: str | None, environ=os.environ) -> bytes:
    """The job's shared secret: the file at `path` (its first line), else `TRAINER_RDZV_SECRET`.

    Raises:
      ValueError: there is none, or the file cannot be read or is empty; the message says how to set one.
    """
    how = (f"Set the same secret on every node, e.g. `export {SECRET_ENV}=$(python3 -c 'import secrets; "
           f"print(secrets.token_hex(16))')` on one and the same value on the others, or write it to a file "
           "that only you can read and pass --rdzv-secret-file FILE.")
    if path is not None:
        try:
            with open(path, "rb") as f:
                secret = f.readline().strip()
        except OSError as err:
            raise ValueError(f"--rdzv-secret-file must be a readable file. Received: --rdzv-secret-file {path!r} "
                             f"({err.strerror or err}). {how}") from None
        if not secret:
            raise ValueError(f"--rdzv-secret-file must hold the secret on its first line. Received: "
                             f"--rdzv-secret-file {path!r}, whose first line is empty. {how}")
        return secret
    secret = environ.get(SECRET_ENV, "").strip().encode()
    if not secret:
        raise ValueError(f"a job over several machines needs a shared secret, which every node presents at the "
                         f"rendezvous. Received: no {SECRET_ENV} in the environment and no --rdzv-secret-file. {how}")
    return secret


def _proof(secret: bytes, purpose: str, challenge: str) -> str:
    """What a holder of `secret` answers to `challenge` (HMAC-SHA256): the secret itself never travels."""
    return hmac.new(secret, f"{purpose}:{challenge}".encode(), hashlib.sha256).hexdigest()


def _proven(secret: bytes, purpose: str, challenge: str, proof) -> bool:
    return isinstance(proof, str) and hmac.compare_digest(_proof(secret, purpose, challenge), proof)


@dataclasses.dataclass(frozen=True)
class Node:
    """One machine's part of the job, as it reports it at the rendezvous."""

    rank: int
    host: str  # the address the other nodes reach it by
    workers: int
    ps: int
    ports: tuple[int, ...]  # free ports: one per worker, one per ps task, and one for a chief


def node_cluster(nodes: list[Node]) -> tuple[dict[str, list[str]], list[list[tuple[str, int]]]]:
    """The cluster of every node's tasks (in node order), and each node's (task type, index) list.

    Without ps tasks, the workers form a MultiWorkerMirroredStrategy cluster and node 0's first worker is
    the chief. With ps tasks on any node, node 0 also runs the chief (the coordinator).
    """
    nodes = sorted(nodes, key=lambda n: n.rank)
    with_ps = any(n.ps for n in nodes)
    cluster: dict[str, list[str]] = {"chief": [], "worker": [], "ps": []} if with_ps else {"worker": []}
    own: list[list[tuple[str, int]]] = []
    for node in nodes:
        mine = []
        if with_ps and node.rank == 0:
            mine.append(("chief", 0))
            cluster["chief"].append(f"{node.host}:{node.ports[-1]}")
        kinds = ["worker"] * node.workers + ["ps"] * node.ps
        for kind, port in zip(kinds, node.ports):
            mine.append((kind, len(cluster[kind])))
            cluster[kind].append(f"{node.host}:{port}")
        own.append(mine)
    return cluster, own


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


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the rendezvous gave this node: the whole cluster, its own tasks, and its link to the others."""

    cluster: dict[str, list[str]]
    tasks: list[tuple[str, int]]
    link: "Alone | NodeLink | Hub"


class Alone:
    """The link of a launcher on one machine: no other node to hear from or tell."""

    def poll(self) -> tuple[int, str] | None:
        return None

    def stopping(self, status: int, why: str) -> None:
        pass

    def finish(self, status: int) -> int:
        return status


class NodeLink:
    """Node r > 0's link to node 0: hears stops from it, tells it of its own."""

    def __init__(self, channel: Channel, rank: int):
        self.channel, self.rank = channel, rank

    def poll(self) -> tuple[int, str] | None:
        try:
            message = self.channel.receive(0)
        except ConnectionError:
            return 1, "node 0's launcher is gone (its machine stopped, or it was killed)"
        if message is not None and "stop" in message:
            return int(message["stop"]), str(message.get("why", "node 0 stopped the job"))
        return None

    def stopping(self, status: int, why: str) -> None:
        self.channel.send({"stop": status, "why": f"node {self.rank}: {why}"})

    def finish(self, status: int) -> int:
        if status == 0:
            self.channel.send({"done": True})
        self.channel.close()
        return status


class Hub:
    """Node 0's links to every other node: relays a stop from one node to the others."""

    def __init__(self, channels: dict[int, Channel], servers_only: bool):
        self.channels = channels
        self.servers_only = servers_only  # the other nodes only serve (parameter-server training)
        self.done: set[int] = set()

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
        self.done.add(source)
        for rank, channel in self.channels.items():
            if rank != source:
                channel.send({"stop": status, "why": why})
        return status, why

    def stopping(self, status: int, why: str) -> None:
        for channel in self.channels.values():
            channel.send({"stop": status, "why": f"node 0: {why}"})

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


def join(*, nnodes: int, node_rank: int, master_addr: str, master_port: int, workers: int, ps: int,
         timeout: float, free_ports, secret: bytes, node_addr: str | None = None, interrupted=lambda: False) -> Plan:
    """Meets the other nodes at node 0's rendezvous; returns this node's `Plan`.

    `free_ports(count)` gives free ports on this machine for its tasks; `secret` is the job's shared secret
    (`read_secret`); `node_addr` the address the other nodes reach this one's tasks by (default: node 0's
    `master_addr` on node 0, elsewhere the address this machine reached node 0 from); `interrupted()` says
    whether a stop was requested (Ctrl-C, SIGTERM), looked at every half second while waiting.

    Raises:
      RendezvousError: a node did not arrive within `timeout` seconds, node 0 could not be reached or
        could not serve, the nodes disagree (their --nnodes, a --node-rank used twice), or a node or
        node 0 presented another secret.
      Interrupted: a stop was requested meanwhile.
    """
    if node_rank == 0:
        return _host(nnodes, node_addr or master_addr, master_port, workers, ps, timeout, free_ports, secret,
                     interrupted)
    channel = _connect(master_addr, master_port, timeout, node_rank, interrupted)
    where = f"node 0's rendezvous at {master_addr}:{master_port}"
    challenge = secrets.token_hex(16)
    deadline = time.monotonic() + timeout + 30  # node 0 answers once every node arrived, or when it gives up
    reply = None
    try:
        hello, until = None, time.monotonic() + 10
        while hello is None and time.monotonic() < until:
            hello = _waited(channel, _TICK, interrupted, node_rank)
        if hello is None or "challenge" not in hello:
            raise RendezvousError(f"node {node_rank} reached {where}, but what answered is not node 0's launcher "
                                  "(no challenge). Check --master-addr and --master-port on every node.")
        channel.send({"nnodes": nnodes, "rank": node_rank, "host": node_addr or channel.sock.getsockname()[0],
                      "workers": workers, "ps": ps, "ports": free_ports(workers + ps + 1),
                      "proof": _proof(secret, "node", str(hello["challenge"])), "challenge": challenge})
        while reply is None and time.monotonic() < deadline:
            reply = _waited(channel, _TICK, interrupted, node_rank)
    except ConnectionError:
        reply = {"error": f"node 0's launcher at {master_addr}:{master_port} closed the rendezvous without an "
                          "answer (it stopped or was killed)"}
    except RendezvousError:
        channel.close()
        raise
    if reply is None or "error" in reply:
        channel.close()
        why = reply["error"] if reply else f"node 0 at {master_addr}:{master_port} sent no cluster in {timeout:.0f} s"
        raise RendezvousError(why)
    if not _proven(secret, "cluster", challenge, reply.get("proof")):
        channel.close()
        raise RendezvousError(f"{where} answered with a cluster but not with this job's secret: node 0 holds another "
                              f"{SECRET_ENV} (or --rdzv-secret-file), or it is not this job's node 0. Nothing was "
                              "started here. Set the same secret on every node.")
    return Plan(cluster=reply["cluster"], tasks=[tuple(t) for t in reply["tasks"]], link=NodeLink(channel, node_rank))


def _waited(channel: Channel, timeout: float, interrupted, node_rank: int) -> dict | None:
    """The next message from node 0 within `timeout`, looking at the stop requests meanwhile."""
    if interrupted():
        raise Interrupted(f"node {node_rank} was interrupted while waiting for the other nodes")
    return channel.receive(timeout)


def _connect(master_addr: str, master_port: int, timeout: float, node_rank: int, interrupted) -> Channel:
    """A connection to node 0's rendezvous, retried until `timeout` (node 0 may start later)."""
    deadline = time.monotonic() + timeout
    while True:
        if interrupted():
            raise Interrupted(f"node {node_rank} was interrupted while looking for node 0")
        try:
            return Channel(socket.create_connection((master_addr, master_port), timeout=5))
        except OSError as err:
            if time.monotonic() > deadline:
                raise RendezvousError(
                    f"node {node_rank} could not reach node 0's rendezvous at {master_addr}:{master_port} in "
                    f"{timeout:.0f} s ({err}). Start trainer-launch with --node-rank 0 on {master_addr} (it serves "
                    "the rendezvous), check --master-addr and --master-port on every node, or raise --rdzv-timeout."
                ) from None
            time.sleep(_TICK)


def _host(nnodes: int, master_addr: str, master_port: int, workers: int, ps: int, timeout: float,
          free_ports, secret: bytes, interrupted) -> Plan:
    """Node 0: serves the rendezvous until every node has arrived, then sends each its part."""
    try:
        listener = socket.create_server(("", master_port))
    except OSError as err:
        raise RendezvousError(
            f"node 0 cannot serve the rendezvous on port {master_port} ({err}). Pass a free --master-port, the "
            "same on every node."
        ) from None
    nodes = {0: Node(0, master_addr, workers, ps, tuple(free_ports(workers + ps + 1)))}
    channels: dict[int, Channel] = {}
    challenges: dict[int, str] = {}  # each node's challenge to node 0, answered with the cluster
    deadline = time.monotonic() + timeout
    try:
        with listener:
            while len(nodes) < nnodes:
                if interrupted():
                    raise Interrupted("node 0 was interrupted before every node had arrived")
                left = deadline - time.monotonic()
                ready, _, _ = select.select([listener], [], [], min(_TICK, max(0.0, left)))
                if not ready and left > _TICK:
                    continue
                if not ready:
                    missing = ", ".join(str(r) for r in range(nnodes) if r not in nodes)
                    raise RendezvousError(
                        f"node(s) {missing} of {nnodes} never joined the rendezvous at {master_addr}:{master_port} "
                        f"in {timeout:.0f} s (joined: {', '.join(str(r) for r in sorted(nodes))}). Start "
                        f"trainer-launch --nnodes {nnodes} --node-rank N --master-addr {master_addr} --master-port "
                        f"{master_port} on each missing node, check that it reaches {master_addr}:{master_port}, "
                        "or raise --rdzv-timeout."
                    )
                channel = Channel(listener.accept()[0])
                node, challenge = _arrival(channel, nnodes, nodes, secret)
                if node is not None:
                    nodes[node.rank], channels[node.rank] = node, channel
                    challenges[node.rank] = challenge
    except BaseException as err:
        for channel in channels.values():
            channel.send({"error": str(err) if isinstance(err, RendezvousError) else "node 0 stopped"})
            channel.close()
        raise
    cluster, own = node_cluster(list(nodes.values()))
    for rank, channel in channels.items():
        channel.send({"cluster": cluster, "tasks": own[rank], "proof": _proof(secret, "cluster", challenges[rank])})
    servers_only = "chief" in cluster
    return Plan(cluster=cluster, tasks=own[0], link=Hub(channels, servers_only))


def _arrival(channel: Channel, nnodes: int, nodes: dict[int, Node], secret: bytes) -> tuple[Node | None, str]:
    """The node that just connected, once it proved it holds the job's secret and said who it is, with its
    challenge to node 0; (None, "") for a stray connection.

    Raises:
      RendezvousError: the node presented another secret, or disagrees with node 0 (another --nnodes); a
        rank already taken is refused, but the job goes on.
    """
    challenge = secrets.token_hex(16)
    channel.send({"challenge": challenge})
    try:
        hello = channel.receive(10)
    except ConnectionError:
        hello = None
    if hello is None or "rank" not in hello:
        channel.close()
        return None, ""
    rank = int(hello["rank"])
    if not _proven(secret, "node", challenge, hello.get("proof")):
        address = _peer(channel)
        why = (f"node {rank} at {address} presented another secret than node 0's: it was refused, and nothing "
               f"started. Set the same {SECRET_ENV} (or --rdzv-secret-file) on every node of the job.")
        channel.send({"error": why})
        channel.close()
        raise RendezvousError(why)
    if int(hello["nnodes"]) != nnodes:
        why = (f"node {rank} was started with --nnodes {hello['nnodes']} and node 0 with --nnodes {nnodes}. "
               "Start every node with the same --nnodes.")
        channel.send({"error": why})
        channel.close()
        raise RendezvousError(why)
    if rank in nodes:
        channel.send({"error": f"--node-rank {rank} is taken (by {nodes[rank].host}). Give each machine its own "
                               f"--node-rank, 0 to {nnodes - 1}."})
        channel.close()
        return None, ""
    node = Node(rank, str(hello["host"]), int(hello["workers"]), int(hello["ps"]), tuple(hello["ports"]))
    return node, str(hello.get("challenge", ""))


def _peer(channel: Channel) -> str:
    try:
        return str(channel.sock.getpeername()[0])
    except OSError:
        return "an address that is gone"
