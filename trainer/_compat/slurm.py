"""Slurm's compressed host lists and tasks per node, parsed as TensorFlow parses them.
"""

from __future__ import annotations

try:  # tensorflow/python/distribute/cluster_resolver/slurm_cluster_resolver.py (2.18-2.22): Slurm's
    # compressed host lists ("gpu[01-04],cpu7") and tasks per node ("4(x2),2"), parsed as TensorFlow parses them
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
        expand_hostlist,
        expand_tasks_per_node,
    )
except ImportError:  # pragma: no cover
    def expand_hostlist(hostlist: str) -> list[str]:
        raise RuntimeError("This TensorFlow has no Slurm host-list parser; set TF_CONFIG for each task instead.")

    expand_tasks_per_node = expand_hostlist

