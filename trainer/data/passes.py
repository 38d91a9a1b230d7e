"""Where fit's epochs read: the input's passes, cut into epochs as Keras's epoch iterator cuts them.

`Passes` keeps the arithmetic of keras/src/trainers/epoch_iterator.py (an epoch is one pass, or with
`steps_per_epoch` a stretch of one stream that the pass's end cuts short), and only that: the readers that
follow it are `loop.ReaderSteps`, the sizes of the trainer's own calls `fusion.py`'s. The rule, with examples:
docs/input_forms.md, "Forms".
"""

from __future__ import annotations

import dataclasses

# Keras's words when an epoch ends before steps_per_epoch because the data ran out.
RAN_OUT = ("Your input ran out of data; interrupting training. Make sure that your dataset or generator can generate "
           "at least `steps_per_epoch * epochs` batches. You may need to use the `.repeat()` function when building "
           "your dataset.")


@dataclasses.dataclass
class Passes:
    """The pass an epoch reads and the steps read from it.

    Attributes:
      steps_per_epoch: fit's `steps_per_epoch`, or None: an epoch is one pass.
      pass_steps: global steps in one pass; None when unknown (a generator) or
        endless (a repeated dataset). An unknown pass ends where its reader runs dry.
      steps_per_call: Keras's call, in steps: the model's compiled `steps_per_execution`.
      epoch: the epoch begun last.
      index: the pass read now, counted from the first epoch of the fit (arrays
        shuffle each pass from it).
      step: steps read from that pass.
      spent: the pass ran out; the next epoch reads a new one.
      called_past_end: in the epoch begun last, Keras would have called a step on the
        empty iterator of a pass of unknown length (`engine/past_end.py`).
    """

    steps_per_epoch: int | None
    pass_steps: int | None
    steps_per_call: int = 1
    epoch: int = -1
    index: int = -1
    step: int = 0
    spent: bool = True
    called_past_end: bool = False

    @classmethod
    def starting_at(cls, epoch: int, steps_per_epoch: int | None, pass_steps: int | None,
                    steps_per_call: int = 1) -> "Passes":
        """Passes for a fit whose first epoch is `epoch` (fit's `initial_epoch`): its first pass is `epoch`."""
        return cls(steps_per_epoch, pass_steps, steps_per_call, epoch=epoch - 1, index=epoch - 1)

    @property
    def epoch_steps(self) -> int | None:
        """Steps a whole epoch runs while the data lasts: `steps_per_epoch` rounded up to whole calls."""
        if self.steps_per_epoch is None:
            return self.pass_steps
        return -(-self.steps_per_epoch // self.steps_per_call) * self.steps_per_call

    def begin_epoch(self, epoch: int, first_step: int = 0) -> bool:
        """Begins `epoch` at its step `first_step`; True when the reader must start again: a new pass, or a
        resumed run's place.

        A resumed run (a later epoch than the next, or a first step past 0) is
        placed where the uninterrupted run would be, where the passes' length
        is known; else it reads a new pass from `first_step`, as
        `input_kind.InputKind.resume` tells the plan.
        """
        skipped = epoch - self.epoch - 1
        exact = self.pass_steps is not None or self.steps_per_epoch is None
        for _ in range(skipped if exact else 0):
            self._whole_epoch()
        self.epoch, self.called_past_end = epoch, False
        new = self.spent or self.steps_per_epoch is None or (skipped > 0 and not exact)
        if new:
            self.index, self.step, self.spent = self.index + 1 + (0 if exact else skipped), 0, False
        self.step += first_step
        if self.pass_steps is not None and self.step >= self.pass_steps:
            self.spent = True  # resumed after the pass's last step (killed before the epoch's end was saved)
        return new or first_step > 0 or skipped > 0

    def resume_at(self, epoch: int, first_step: int, index: int, step: int, spent: bool) -> bool:
        """Begins `epoch` at its step `first_step`, where a backup says its run was: `step` steps read from pass
        `index`, which was `spent`. True (a reader starts there) unless the epoch has nothing left to read.

        The backup's place, not arithmetic, says where a stream cut by
        `steps_per_epoch` is: it may have run dry and started again.
        """
        self.epoch, self.called_past_end = epoch, False
        if first_step == 0 and (spent or self.steps_per_epoch is None):  # a new pass, as `begin_epoch` begins
            self.index, self.step, self.spent = index + 1, 0, False
        else:
            self.index, self.step, self.spent = index, step, spent
        if self.pass_steps is not None and self.step >= self.pass_steps:
            self.spent = True
        return not self.spent

    def call_steps(self, epoch_step: int, wanted: int) -> int:
        """Steps the epoch's next call may run, from its step `epoch_step`: at most `wanted`, and 0 once the
        epoch is over."""
        if self.spent:
            return 0
        limits = [wanted]
        if self.steps_per_epoch is not None:
            limits.append(self.epoch_steps - epoch_step)
        if self.pass_steps is not None:
            limits.append(self.pass_steps - self.step)
        return max(0, min(limits))

    def ran(self, steps: int, asked: int) -> None:
        """Counts a call that ran `steps` of the `asked`.

        A call that runs none finds the pass spent. One that runs fewer than
        asked does too when Keras calls one step at a time; Keras's calls of S
        steps find it spent only on their next call, which the epoch then makes.
        """
        self.step += steps
        short = steps == 0 or (steps < asked and self.steps_per_call == 1)
        if short and self.steps_per_call == 1 and self.pass_steps is None:
            self.called_past_end = True  # Keras's one-step call found the iterator empty
        if short or (self.pass_steps is not None and self.step >= self.pass_steps):
            self.spent = True

    def cut_short(self, epoch_step: int) -> bool:
        """Whether the epoch, ended at `epoch_step`, ran its pass dry: a pass of unknown length, or one that
        ended before `steps_per_epoch` (Keras warns then)."""
        if not self.spent:
            return False
        return self.pass_steps is None or (self.steps_per_epoch is not None and epoch_step < self.epoch_steps)

    def _whole_epoch(self) -> None:
        if self.spent or self.steps_per_epoch is None:
            self.index, self.step, self.spent = self.index + 1, 0, False
        steps = self.call_steps(0, self.epoch_steps or 0)
        self.ran(steps, steps)
