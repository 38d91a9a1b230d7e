"""What the nodes of a job agree on at the rendezvous: each node's report (`Node`), the one cluster made of
all of them (`node_cluster`), the round of an elastic job node 0 holds (`Round`), and what each node takes
away (`Agreement`), with the words the launcher's log and the plan use for them.

Values and wording only: no sockets and no waiting here (the meeting is `rendezvous.py`), so that every
node derives the same cluster from the same reports. Pure Python.
"""

from __future__ import annotations

import dataclasses

from trainer.launch.links import Alone, Hub, NodeLink


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


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What the rendezvous gave this node: the whole cluster, its own tasks, its link to the others, which
    restart of the job this round is, and how the plan names the launch (node 0 words it for every node)."""

    cluster: dict[str, list[str]]
    tasks: list[tuple[str, int]]
    link: Alone | NodeLink | Hub
    restart: int = 0
    origin: str = ""
    nodes: int = 1


@dataclasses.dataclass(frozen=True)
class Round:
    """One rendezvous of an elastic job, as node 0 holds it: which restart, how many nodes it may start with
    (`nodes` = (least, most)), how long it waits for more once the least are there, and the layout before."""

    restart: int = 0
    max_restarts: int = 0
    nodes: tuple[int, int] = (1, 1)
    last_call: float = 0.0
    previous: str = ""


def layout(cluster: dict[str, list[str]], nodes: int) -> str:
    """"2 nodes, 3 workers" (and ps tasks): a round's layout, as the launcher's log and the plan name it."""
    workers = len(cluster.get("worker", []))
    text = f"{nodes} node{'s' if nodes != 1 else ''}, {workers} worker{'s' if workers != 1 else ''}"
    return text + (f", {len(cluster['ps'])} ps" if cluster.get("ps") else "")


def origin_text(nodes: int, master_addr: str, cluster: dict[str, list[str]], round_: Round) -> str:
    """How the plan's cluster row names this launch: "trainer-launch on 2 nodes (node 0 at host0)", and on a
    restart which one, and the layout before."""
    text = f"trainer-launch on {nodes} node{'s' if nodes != 1 else ''} (node 0 at {master_addr})"
    if round_.restart:
        text += f", restart {round_.restart} of {round_.max_restarts} (before: {round_.previous})"
    return text


def nodes_text(nnodes) -> str:
    """--nnodes as given: "2", or "1:2" for (least, most) nodes."""
    least, most = nnodes
    return str(most) if least == most else f"{least}:{most}"
