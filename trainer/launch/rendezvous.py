"""Several machines without a scheduler: node 0's rendezvous, where the launchers meet at the start of a job
and again at each restart (`Host` serves it; every other node `join`s it).

This module holds the meeting only: what is agreed is `agreement.py`'s, the secret and its proofs are
`secret.py`'s, and it starts no task. Pure Python: no TensorFlow here. The rendezvous as users meet it:
docs/multi_worker.md, "Several machines".
"""

from __future__ import annotations

import secrets
import select
import socket
import time

from trainer.launch.agreement import Agreement, Node, Round, node_cluster, nodes_text, origin_text
from trainer.launch.links import TICK, Channel, Hub, NodeLink
from trainer.launch.secret import SECRET_ENV, proof, proven

DEFAULT_MASTER_PORT = 29400
DEFAULT_TIMEOUT = 300.0  # seconds for every node to arrive


class RendezvousError(RuntimeError):
    """The nodes could not agree on a cluster; the message says which node and what to do."""


class Interrupted(RendezvousError):
    """Ctrl-C or SIGTERM before every node had arrived."""


class JobEnded(RendezvousError):
    """The job completed while this node waited to join it at its next restart: there is nothing to do."""


def join(*, nnodes: tuple[int, int], node_rank: int, master_addr: str, master_port: int, workers: int, ps: int,
         timeout: float, free_ports, secret: bytes, node_addr: str | None = None, host: "Host | None" = None,
         round_: Round | None = None, interrupted=lambda: False) -> Agreement:
    """Meets the other nodes at node 0's rendezvous; returns this node's `Agreement`.

    `nnodes` is (least, most) nodes; `free_ports(count)` gives free ports on this machine for its tasks;
    `secret` is the job's shared secret (`secret.read_secret`); `node_addr` the address the other nodes reach this
    one's tasks by (default: node 0's `master_addr` on node 0, elsewhere the address this machine reached
    node 0 from); `host` node 0's listener (`Host`) and `round_` its round; `interrupted()` says whether a
    stop was requested (Ctrl-C, SIGTERM), looked at every half second while waiting.

    Raises:
      RendezvousError: too few nodes arrived within `timeout` seconds, node 0 could not be reached or
        could not serve, the nodes disagree (their --nnodes, a --node-rank used twice), or a node or
        node 0 presented another secret.
      Interrupted: a stop was requested meanwhile.
    """
    if node_rank == 0:
        own = Node(0, node_addr or master_addr, workers, ps, tuple(free_ports(workers + ps + 1)))
        return _gather(host, own, nnodes, timeout, secret, round_ or Round(nodes=nnodes), interrupted)
    channel = _connect(master_addr, master_port, timeout, node_rank, interrupted)
    where = f"node 0's rendezvous at {master_addr}:{master_port}"
    challenge = secrets.token_hex(16)
    deadline = time.monotonic() + timeout + 30  # node 0 answers once enough nodes arrived, or when it gives up
    reply = None
    try:
        hello = None  # node 0 challenges once it holds a rendezvous (at once, or at the job's next restart)
        while hello is None and time.monotonic() < deadline:
            hello = _waited(channel, TICK, interrupted, node_rank)
        if hello is not None and "ended" in hello:
            raise JobEnded(f"node {node_rank}: {hello['ended']}")
        if hello is None or "challenge" not in hello:
            raise RendezvousError(f"node {node_rank} reached {where}, but what answered is not node 0's launcher "
                                  "(no challenge). Check --master-addr and --master-port on every node.")
        channel.send({"nnodes": list(nnodes), "max_restarts": (round_ or Round()).max_restarts, "rank": node_rank,
                      "host": node_addr or channel.sock.getsockname()[0], "workers": workers, "ps": ps,
                      "ports": free_ports(workers + ps + 1), "challenge": challenge,
                      "proof": proof(secret, "node", str(hello["challenge"]))})
        while reply is None and time.monotonic() < deadline:
            reply = _waited(channel, TICK, interrupted, node_rank)
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
    if not proven(secret, "cluster", challenge, reply.get("proof")):
        channel.close()
        raise RendezvousError(f"{where} answered with a cluster but not with this job's secret: node 0 holds another "
                              f"{SECRET_ENV} (or --rdzv-secret-file), or it is not this job's node 0. Nothing was "
                              "started here. Set the same secret on every node.")
    return Agreement(cluster=reply["cluster"], tasks=[tuple(t) for t in reply["tasks"]],
                     link=NodeLink(channel, node_rank), restart=int(reply.get("restart", 0)),
                     origin=str(reply.get("origin", "")), nodes=int(reply.get("nodes", 1)))


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
            time.sleep(TICK)


class Host:
    """Node 0's rendezvous: a listener on `master_port`, open for the whole job, so that the nodes meet again
    at each restart (a node that connects meanwhile waits for the next)."""

    def __init__(self, master_addr: str, master_port: int):
        self.where = f"{master_addr}:{master_port}"
        try:
            self.listener = socket.create_server(("", master_port))
        except OSError as err:
            raise RendezvousError(
                f"node 0 cannot serve the rendezvous on port {master_port} ({err}). Pass a free --master-port, the "
                "same on every node."
            ) from None

    def dismiss(self, why: str) -> None:
        """Tells the nodes that came back and wait for the next restart that there is none: `why`."""
        while select.select([self.listener], [], [], 0)[0]:
            channel = Channel(self.listener.accept()[0])
            channel.send({"ended": why})
            channel.close()

    def __enter__(self) -> "Host":
        return self

    def __exit__(self, *exc) -> None:
        self.listener.close()


def _gather(host: Host, own: Node, nnodes: tuple[int, int], timeout: float, secret: bytes, round_: Round,
            interrupted) -> Agreement:
    """Node 0: holds a rendezvous until the most nodes have arrived, or the least have and no other came within
    the last call; then sends each node its part."""
    least, most = nnodes
    nodes = {0: own}
    channels: dict[int, Channel] = {}
    challenges: dict[int, str] = {}  # each node's challenge to node 0, answered with the cluster
    deadline, quorum = time.monotonic() + timeout, None
    try:
        while len(nodes) < most:
            now = time.monotonic()
            if len(nodes) >= least:
                quorum = quorum or now
                if now - quorum >= round_.last_call:
                    break
            if interrupted():
                raise Interrupted("node 0 was interrupted before every node had arrived")
            left = deadline - now
            ready, _, _ = select.select([host.listener], [], [], min(TICK, max(0.0, left)))
            if not ready and left > TICK:
                continue
            if not ready:
                raise RendezvousError(_too_few(nodes, nnodes, host.where, timeout))
            channel = Channel(host.listener.accept()[0])
            node, challenge = _arrival(channel, nnodes, round_.max_restarts, nodes, secret)
            if node is not None:
                nodes[node.rank], channels[node.rank] = node, channel
                challenges[node.rank] = challenge
    except BaseException as err:
        for channel in channels.values():
            channel.send({"error": str(err) if isinstance(err, RendezvousError) else "node 0 stopped"})
            channel.close()
        raise
    cluster, own_tasks = node_cluster(list(nodes.values()))
    origin = origin_text(len(nodes), host.where.rsplit(":", 1)[0], cluster, round_)
    for rank, channel in channels.items():
        channel.send({"cluster": cluster, "tasks": own_tasks[rank], "restart": round_.restart, "origin": origin,
                      "nodes": len(nodes), "proof": proof(secret, "cluster", challenges[rank])})
    link = Hub(channels, servers_only="chief" in cluster, can_restart=round_.restart < round_.max_restarts)
    return Agreement(cluster=cluster, tasks=own_tasks[0], link=link, restart=round_.restart, origin=origin,
                     nodes=len(nodes))


def _too_few(nodes: dict[int, Node], nnodes: tuple[int, int], where: str, timeout: float) -> str:
    least, most = nnodes
    missing = ", ".join(str(r) for r in range(most) if r not in nodes)
    count = f"{most}" if least == most else f"{least}:{most} (at least {least})"
    return (f"node(s) {missing} of {count} never joined the rendezvous at {where} in {timeout:.0f} s (joined: "
            f"{', '.join(str(r) for r in sorted(nodes))}). Start trainer-launch --nnodes {count.split(' ')[0]} "
            f"--node-rank N --master-addr {where.rsplit(':', 1)[0]} --master-port {where.rsplit(':', 1)[1]} on each "
            "missing node, check that it reaches node 0, or raise --rdzv-timeout.")


def _arrival(channel: Channel, nnodes: tuple[int, int], max_restarts: int, nodes: dict[int, Node],
             secret: bytes) -> tuple[Node | None, str]:
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
    if not proven(secret, "node", challenge, hello.get("proof")):
        address = _peer(channel)
        why = (f"node {rank} at {address} presented another secret than node 0's: it was refused, and nothing "
               f"started. Set the same {SECRET_ENV} (or --rdzv-secret-file) on every node of the job.")
        channel.send({"error": why})
        channel.close()
        raise RendezvousError(why)
    if tuple(hello["nnodes"]) != tuple(nnodes):
        why = (f"node {rank} was started with --nnodes {nodes_text(hello['nnodes'])} and node 0 with --nnodes "
               f"{nodes_text(nnodes)}. Start every node with the same --nnodes.")
        channel.send({"error": why})
        channel.close()
        raise RendezvousError(why)
    if int(hello.get("max_restarts", 0)) != max_restarts:
        why = (f"node {rank} was started with --max-restarts {hello.get('max_restarts', 0)} and node 0 with "
               f"--max-restarts {max_restarts}. Start every node with the same --max-restarts.")
        channel.send({"error": why})
        channel.close()
        raise RendezvousError(why)
    if rank in nodes:
        channel.send({"error": f"--node-rank {rank} is taken (by {nodes[rank].host}). Give each machine its own "
                               f"--node-rank, 0 to {nnodes[1] - 1}."})
        channel.close()
        return None, ""
    node = Node(rank, str(hello["host"]), int(hello["workers"]), int(hello["ps"]), tuple(hello["ports"]))
    return node, str(hello.get("challenge", ""))


def _peer(channel: Channel) -> str:
    try:
        return str(channel.sock.getpeername()[0])
    except OSError:
        return "an address that is gone"
