"""bench/throughput.py's ratios: Trainer / each variant, round by round, with a teardown left out or not."""

import pytest
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))

import throughput  # noqa: E402

from conftest import run_script  # noqa: E402


class _Runner:
    """Trains `examples` in `seconds` of steps plus `teardown` seconds of iterator teardown per epoch."""

    step_seconds = None

    def __init__(self, examples, seconds, teardown=None):
        self.examples, self.seconds, self.teardown_seconds = examples, list(seconds), None
        self._teardowns = list(teardown) if teardown else None

    def epoch(self):
        import time

        seconds = self.seconds.pop(0)
        if self._teardowns is not None:
            self.teardown_seconds = self._teardowns.pop(0)
            seconds += self.teardown_seconds
        time.sleep(seconds)
        return self.examples


def test_ratios_are_medians_of_per_round_ratios():
    rates = {"trainer": [10.0, 20.0, 30.0], "other": [5.0, 40.0, 10.0]}
    ratios = throughput._ratios(rates)
    assert ratios["trainer"] == 1.0
    assert ratios["other"] == statistics.median([2.0, 0.5, 3.0])


def test_measure_reports_teardown_and_ratios_without_it(monkeypatch):
    monkeypatch.setattr(throughput, "one_malloc_state", lambda: {})
    runners = {"trainer": _Runner(100, [0.0, 0.1, 0.1, 0.1]),
               "keras": _Runner(100, [0.0, 0.1, 0.1, 0.1], teardown=[0.0, 0.1, 0.0, 0.1])}
    result = throughput.measure(runners, repeats=3)
    assert result["teardown_seconds"] == {"keras": [0.1, 0.0, 0.1]}  # the warm-up epoch took the first
    with_teardown = result["trainer_ratio"]["keras"]
    without = result["trainer_ratio_without_teardown"]["keras"]
    assert 1.6 < with_teardown < 2.4  # 0.2 s against 0.1 s in two rounds of three
    assert 0.8 < without < 1.25


@pytest.mark.slow
def test_step_cost_times_every_variant_call_by_call(tmp_path):
    import json

    out = tmp_path / "step_cost.json"
    script = os.path.join(os.path.dirname(throughput.__file__), "step_cost.py")
    run_script(script, "--examples", 640, "--rounds", 3, "--steps-per-call", 2, "--profile-rounds", 1, "--out", out)
    result = json.loads(out.read_text())
    assert set(result["all_seconds_per_step"]) == {"trainer", "trainer_no_metrics", "bare_step"}
    for name, times in result["all_seconds_per_step"].items():
        assert len(times) == 3 and all(t > 0 for t in times)
        ratios = [b / t for t, b in zip(times, result["all_seconds_per_step"]["bare_step"])]
        assert result["speed_over_bare_step"][name] == statistics.median(ratios)

    # The profile finds what the Trainer runs beyond the floor: the accuracy metric's ArgMax only where it is compiled.
    profiled = result["profile"]["variants"]
    assert set(profiled) == {"trainer", "trainer_no_metrics", "bare_step"}
    # Every variant runs the same model: the same convolution events per step, and the Trainer more ops in all.
    convolutions = {name: {t: n for t, n in v["op_type_events"].items() if "Conv2D" in t}
                    for name, v in profiled.items()}
    assert convolutions["bare_step"] and all(c == convolutions["bare_step"] for c in convolutions.values())
    assert (profiled["trainer"]["op_events"] > profiled["trainer_no_metrics"]["op_events"]
            > profiled["bare_step"]["op_events"])
    assert "ArgMax" in profiled["trainer"]["beyond_floor"]["op_types"]
    assert "ArgMax" not in profiled["trainer_no_metrics"]["beyond_floor"]["op_types"]
    assert "beyond_floor" not in profiled["bare_step"]


def test_beyond_floor_counts_only_op_types_run_more_often():
    import step_cost

    bare = {"op_type_ms": {"Conv2D": 5.0, "Cast": 0.02}, "op_type_events": {"Conv2D": 2.0, "Cast": 10.0}}
    trainer = {"op_type_ms": {"Conv2D": 5.5, "Cast": 0.03, "ArgMax": 0.01},
               "op_type_events": {"Conv2D": 2.0, "Cast": 13.0, "ArgMax": 1.0}}
    extra = step_cost.beyond_floor(trainer, bare)
    # Conv2D ran as often in both: its slower time is noise in the kernels, not extra work.
    assert set(extra["op_types"]) == {"Cast", "ArgMax"}
    assert extra["op_types"]["Cast"]["events"] == 3.0
    assert abs(extra["op_types"]["Cast"]["ms"] - 0.01) < 1e-12
    assert extra["events"] == 4.0
    assert abs(extra["ms"] - 0.02) < 1e-12
