"""Which strategy a call runs on: the Trainer's setting resolved once per name, or the strategy the call
already sits in (a user's scope, the model's home, a DistributedDataset's maker). Refuses a mix TensorFlow
can't run before anything runs."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from trainer.distribute import collectives
from trainer.distribute import strategy as strategy_lib
from trainer.distribute.ambient import ambient_strategy, data_strategy, model_home, same_layout, takes
from trainer.engine.plan import strategy_label


class Strategies:
    """The strategies a Trainer made, one instance per name, so that every call on a name runs on the same one."""

    def __init__(self):
        self._made: dict[Any, tf.distribute.Strategy] = {}

    def resolve(self, setting) -> tf.distribute.Strategy:
        """The strategy for `setting` (a name or a strategy), made at the first use of a name."""
        strategy_lib.check_strategy_name(setting)
        if not isinstance(setting, tf.distribute.Strategy) and setting not in self._made:
            self._made[setting] = strategy_lib.resolve_strategy(setting)
        resolved = setting if isinstance(setting, tf.distribute.Strategy) else self._made[setting]
        collectives.claim_group_keys(resolved)
        return resolved

    def for_call(self, setting, model: Any = None, arguments: dict[str, Any] | None = None
                 ) -> tf.distribute.Strategy:
        """The strategy a call runs on: the one its data was distributed with, else `setting` (the call's, else
        the Trainer's), else the one whose scope the call sits in, else the one the model was built in.

        As under `model.fit`, "auto" takes the strategy of the user's
        `with strategy.scope():` the call sits in, else the one whose scope the
        model was built in; "multi_worker" takes such a
        MultiWorkerMirroredStrategy (TensorFlow runs one per process). TensorFlow
        runs one strategy's scope at a time: inside a user's scope, a name the
        strategy fits (a "mirrored" Trainer inside a MirroredStrategy's scope
        over the same devices) takes it too, and any other strategy is refused.
        """
        ambient = ambient_strategy()
        carried = data_strategy(arguments or {})
        if carried is not None:
            return self._carried(setting, carried, ambient)
        given = ambient or model_home(model)
        if given is not None and takes(setting, given):
            collectives.claim_group_keys(given)
            return given
        resolved = self.resolve(setting)
        if ambient is None or ambient is resolved:
            return resolved
        if isinstance(setting, str) and same_layout(ambient, resolved):
            collectives.claim_group_keys(ambient)
            return ambient
        raise ValueError(
            f"`strategy` must be the strategy whose scope this call sits in: TensorFlow runs one strategy's scope "
            f"at a time. Received: strategy={setting!r} ({strategy_label(resolved)}) inside the scope of "
            f"{strategy_label(ambient)}. Call the trainer after the `with strategy.scope():` block (a model built "
            "there trains in place on any strategy), or pass that strategy: Trainer(strategy=strategy)."
        )

    def _carried(self, setting, carried: tf.distribute.Strategy, ambient) -> tf.distribute.Strategy:
        """The strategy a DistributedDataset carries, which the call runs on, unless it was asked for another.

        As under `model.fit` in that strategy's scope: "auto" takes it, and so does the
        strategy object itself or a name of the same kind over the same devices.
        """
        if ambient is not None and ambient is not carried:
            received = f"a call inside the scope of {strategy_label(ambient)}"
        elif setting is carried or takes(setting, carried) or (
                isinstance(setting, str) and same_layout(self.resolve(setting), carried)):
            collectives.claim_group_keys(carried)
            return carried
        else:
            received = f"strategy={setting!r}"
            if isinstance(setting, tf.distribute.Strategy):
                received = f"strategy=another {strategy_label(setting)} object"
        raise ValueError(
            f"The data was distributed with {strategy_label(carried)}, and a tf.distribute.DistributedDataset runs "
            f"on the strategy that made it. Received: {received}. Leave the Trainer's strategy at 'auto' (or pass "
            "Trainer(strategy=strategy), the same object), or pass the tf.data.Dataset or the dataset function "
            "undistributed: the trainer distributes it."
        )
