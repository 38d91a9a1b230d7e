"""`ChiefOnly`: a callback run on the chief only, for callbacks that log somewhere shared.

Every worker runs the same callbacks, as under `model.fit`: a callback that
stops training or changes the learning rate must decide alike everywhere. A
callback that only reports (an experiment tracker's logger: MLflow's, W&B's)
would then report once per worker. Wrapped in `ChiefOnly` it runs on the chief
alone.
"""

from __future__ import annotations

import keras

from ._cluster import ContextAware

_HOOKS = tuple(name for name in vars(keras.callbacks.Callback) if name.startswith("on_"))


class ChiefOnly(ContextAware):
    """Runs `callback`'s hooks on the chief and nowhere else.

    Only for callbacks that change nothing in training: a callback that sets
    `model.stop_training` or the learning rate on the chief alone would leave
    the workers out of step.

    ```python
    trainer.fit(model, x, y, callbacks=[ChiefOnly(mlflow.keras.MlflowCallback())])
    ```

    Args:
      callback: a `keras.callbacks.Callback`.
    """

    def __init__(self, callback: keras.callbacks.Callback):
        if not isinstance(callback, keras.callbacks.Callback):
            raise TypeError(f"`callback` must be a keras.callbacks.Callback. Received: callback={callback!r} of type "
                            f"{type(callback).__name__}. Pass a callback instance, e.g. ChiefOnly(MyCallback()).")
        super().__init__()
        self.callback = callback
        self.handles_fused_steps = getattr(callback, "handles_fused_steps", False)
        for hook in _HOOKS:  # only the hooks it implements: the loop fuses steps unless a batch hook is there
            own = getattr(callback, hook)
            if getattr(own, "__func__", own) is not getattr(keras.callbacks.Callback, hook):
                setattr(self, hook, self._on_chief(own))

    def _on_chief(self, hook):
        def run(*args, **kwargs):
            if self.is_chief:
                hook(*args, **kwargs)
        return run

    def set_model(self, model) -> None:
        super().set_model(model)
        self.callback.set_model(model)

    def set_params(self, params) -> None:
        super().set_params(params)
        self.callback.set_params(params)

    def set_trainer_context(self, context) -> None:
        super().set_trainer_context(context)
        if self.is_chief and hasattr(self.callback, "set_trainer_context"):
            self.callback.set_trainer_context(context)
