"""What every input kind answers (`InputKind`), with the defaults of a kind that has no Python-side epoch hooks.

The kinds (`trainer/data/array_input.py`, `trainer/data/dataset_inputs.py` and
`trainer/data/pipeline_inputs.py`) override what differs for them. This base knows
no kind and reads no data: what only one family answers belongs in that family's module.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

_PER_WORKER = ("per worker", "each worker reads its own shard, shuffled and repeated; steps go to free workers")


@dataclasses.dataclass(frozen=True)
class Resumption:
    """How a resumed run reads an input, for the plan's resume row.

    Attributes:
      why_not: why it reads other batches than the uninterrupted run would; "" where it reads the same.
      holds: what a backup holds of the input's place, in words.
      layout: where the place holds, in words; "" for any layout with the same global batch.
    """

    why_not: str = ""
    holds: str = ""
    layout: str = ""


class InputKind:
    """What every kind answers; the defaults are those of a kind with no Python-side epoch hooks.

    Every kind also has `form` (its name in the plan and in messages),
    `num_examples` (examples in one pass, or None when unknown), `sample(n)`
    (a batch to build the model on), `reader(...)` (see `Readers`) and
    `per_worker_dataset(...)` (parameter-server training).
    """

    num_examples: int | None

    def num_steps(self, global_batch_size: int) -> int | None:
        """Global steps in one pass, or None when unknown."""
        return None if self.num_examples is None else -(-self.num_examples // global_batch_size)

    def signature(self) -> Any:
        """Structure of (x, y[, w]) with per-example shapes, for comparing two inputs; None when unknown."""
        return None

    @property
    def unknown_to_keras(self) -> bool:
        """Whether model.fit can't tell a pass's length, and so finds its end by a call past it."""
        return self.num_steps(1) is None

    def sharding(self, num_workers: int, *, parameter_server: bool = False) -> tuple[str, str]:
        """(policy, reason) of how the input is split across workers, for the plan."""
        return _PER_WORKER if parameter_server else self._sharding(num_workers)

    def _sharding(self, num_workers: int) -> tuple[str, str]:
        raise NotImplementedError

    # Whether each pass over the input gets a reader of its own (`loop.ReaderSteps`); arrays read all the
    # passes of a fit through one, which shuffles each.
    reader_per_pass = True

    def resume(self, steps_per_epoch: int | None, num_workers: int = 1, in_step: bool = True) -> Resumption:
        """How a run resumed mid-fit reads the input, read on `num_workers` workers, in the step or not."""
        return Resumption(holds="the epoch and step, from which the seed gives the examples' order")

    def epoch_begin(self) -> None:
        """Starts an epoch of reading (a PyDataset's workers)."""

    def epoch_end(self, *, read_all: bool) -> list:
        """Ends an epoch of reading; returns iterators for the caller to release (`eval_loop.release`)."""
        return []


def worker_index() -> tf.Tensor:
    """The parameter-server worker running a per-worker dataset function (known at run time).

    The function is traced once and runs on every worker, so shuffle seeds are
    the same everywhere; sharding by this index keeps the workers' streams apart.
    """
    return tf.distribute.coordinator.experimental_get_current_worker_index()
