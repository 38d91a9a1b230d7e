"""Step fusion: how many train steps each `tf.function` call runs.

Every call costs a fixed amount outside the steps (Python, callbacks, the
dispatch of the function), so short steps want many per call. Many steps per
call delay what happens between calls: progress updates, NaN checks, backups
on SIGTERM. "auto" measures the time per step and sizes calls to last about
`TARGET_CALL_SECONDS`: a call costs a few milliseconds outside the steps
(callbacks, metric reads) plus a pause of the step pipeline at its end, which
calls of about a second make negligible while callbacks still hear from the
loop every second (the measurements: docs/performance.md, bench/throughput.py). A fit starts at FIRST_AUTO_STEPS until
it has timed a call, unless an earlier fit of the same engine and batch size
measured the step time (notebooks and the benchmark call `fit` again and again).
"""

from __future__ import annotations

import dataclasses

TARGET_CALL_SECONDS = 1.0
MULTI_WORKER_STEPS = 32  # workers must agree on call boundaries, so "auto" is fixed there
FIRST_AUTO_STEPS = 4  # before any step has been timed
MAX_AUTO_STEPS = 1000


@dataclasses.dataclass
class StepFusion:
    """Steps per call: fixed, or sized from the measured time per step ("auto").

    Attributes:
      steps: steps the next call runs.
      auto: re-size after every call from its measured time.
    """

    steps: int
    auto: bool = False
    target_seconds: float = TARGET_CALL_SECONDS
    max_steps: int = MAX_AUTO_STEPS
    seconds_per_step: float | None = None  # under "auto", the last measurement
    _timed_calls: int = 0

    @classmethod
    def sized_from_step_time(cls, seconds_per_step: float | None = None) -> "StepFusion":
        """"auto": FIRST_AUTO_STEPS until a step is timed, unless `seconds_per_step` is known already."""
        fusion = cls(FIRST_AUTO_STEPS, auto=True, seconds_per_step=seconds_per_step)
        if seconds_per_step is not None:
            fusion.steps = fusion._sized(seconds_per_step)
        return fusion

    @classmethod
    def for_fit(cls, setting: int | str, *, batch_hooks: bool, steps_per_epoch: int | None,
                num_workers: int, seconds_per_step: float | None = None) -> "StepFusion":
        """The fusion of one `fit`.

        Args:
          setting: the trainer's `steps_per_execution`: a step count, or "auto".
          batch_hooks: a callback wants to hear about every step ("auto" -> 1).
          steps_per_epoch: the epoch's length, when known; caps the multi-worker count.
          num_workers: workers in the cluster; several must agree on call
            boundaries, so "auto" is a fixed MULTI_WORKER_STEPS there instead of
            sized from the measured step time.
          seconds_per_step: measured by an earlier fit of the same engine and
            batch size; "auto" then starts at its size instead of FIRST_AUTO_STEPS.
        """
        if setting != "auto":
            return cls(setting)
        if batch_hooks:
            return cls(1)
        if num_workers > 1:
            return cls(min(MULTI_WORKER_STEPS, steps_per_epoch or MULTI_WORKER_STEPS))
        return cls.sized_from_step_time(seconds_per_step)

    def observe(self, steps_run: int, seconds: float) -> None:
        """Records one call; under "auto", sizes the next one from it."""
        if not self.auto or steps_run == 0:
            return
        self._timed_calls += 1
        if self._timed_calls == 1:
            return  # the first call includes tracing and the input pipeline's start
        self.seconds_per_step = seconds / steps_run
        self.steps = self._sized(self.seconds_per_step)

    def _sized(self, seconds_per_step: float) -> int:
        return max(1, min(self.max_steps, round(self.target_seconds / max(seconds_per_step, 1e-9))))
