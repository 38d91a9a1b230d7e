"""bench/kernel_profile.py's reading of a profiler trace: which events count as kernels, and their union."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))

import kernel_profile  # noqa: E402


def _xspace(lines):
    """An XSpace with one host plane; `lines` maps a line name to (timestamp_ns, [(event name, offset_ps, ps)])."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    ids = {}
    for line_name, (timestamp_ns, events) in lines.items():
        line = plane.lines.add(name=line_name, timestamp_ns=timestamp_ns)
        for name, offset_ps, duration_ps in events:
            if name not in ids:
                ids[name] = len(ids) + 1
                plane.event_metadata[ids[name]].id = ids[name]
                plane.event_metadata[ids[name]].name = name
            line.events.add(metadata_id=ids[name], offset_ps=offset_ps, duration_ps=duration_ps)
    space.planes.add(name="/device:GPU:0").lines.add(name="ops").events.add(metadata_id=1, duration_ps=10**9)
    return space


def test_kernel_events_keep_model_ops_only():
    space = _xspace({
        "tf_Compute/1": (0, [("seq/conv/Conv2D:Conv2D", 0, 10_000), ("seq/pool:MaxPoolGrad", 5_000, 10_000),
                             ("ExecutorState::Process", 0, 100_000), ("loop/while:While", 0, 100_000)]),
        "python": (1, [("EagerLocalExecute: __inference_f_12", 0, 90_000), ("adam/Sub:Sub", 19_000, 5_000)]),
        "tf_data_iterator_get_next/7": (0, [("ParallelMap:MapDataset", 30_000, 10_000)]),
        "tf_Compute/2": (0, [("IteratorGetNext:IteratorGetNext", 50_000, 40_000),
                             ("EagerPyFunc:EagerPyFunc", 50_000, 10_000)]),
    })
    intervals, per_type = kernel_profile.kernel_events(space)
    # The python line starts 1 ns (1000 ps) later, so its Sub runs from 20,000 to 25,000 ps.
    assert sorted(intervals) == [(0, 10_000), (5_000, 15_000), (20_000, 25_000)]
    assert dict(per_type) == {"Conv2D": 10_000, "MaxPoolGrad": 10_000, "Sub": 5_000, "While": 100_000,
                              "IteratorGetNext": 40_000, "EagerPyFunc": 10_000}
    assert kernel_profile.covered_ps(intervals) == 20_000


def test_covered_ps_is_the_union_length():
    rng = np.random.default_rng(3)
    for _ in range(50):
        starts = rng.integers(0, 200, size=rng.integers(1, 12))
        intervals = [(int(s), int(s + d)) for s, d in zip(starts, rng.integers(0, 40, size=len(starts)))]
        covered = np.zeros(300, bool)
        for start, stop in intervals:
            covered[start:stop] = True
        assert kernel_profile.covered_ps(intervals) == covered.sum()
    assert kernel_profile.covered_ps([]) == 0
