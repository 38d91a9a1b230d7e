"""What a callback asks of the trainer's loops: which batch hooks it implements, whether it copes with several
steps per call, whether it knows it runs on every worker; and the steps per call of Keras's own loops."""

from __future__ import annotations

import keras

BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")
TEST_BATCH_HOOKS = ("on_test_batch_begin", "on_test_batch_end")


def overrides_batch_hooks(callback: keras.callbacks.Callback, hooks: tuple[str, ...] = BATCH_HOOKS) -> bool:
    """Whether a callback implements one of `hooks` (train-batch hooks unless told: and so wants batch logs)."""
    base = keras.callbacks.Callback
    for hook in hooks:
        attr = getattr(callback, hook)  # instance attributes count too (LambdaCallback)
        if getattr(attr, "__func__", attr) is not getattr(base, hook):
            return True
    return False


def has_batch_hooks(callback: keras.callbacks.Callback) -> bool:
    """Whether a callback wants to see every step (so steps must not be fused).

    Callbacks that cope with several steps per call set `handles_fused_steps = True`.
    """
    return overrides_batch_hooks(callback) and not getattr(callback, "handles_fused_steps", False)


def unguarded(callbacks: list) -> tuple[str, ...]:
    """The class names of the callbacks that run on every worker without knowing it: neither Keras's own nor
    one that reads the trainer's context (the trainer's callbacks, `ChiefOnly`)."""
    return tuple(type(c).__name__ for c in callbacks
                 if not type(c).__module__.startswith("keras.") and not hasattr(c, "set_trainer_context"))


def keras_steps_per_call(model) -> int:
    """The steps of one call of Keras's own loops: the model's compiled `steps_per_execution` (1 by default)."""
    return int(getattr(model, "steps_per_execution", 1) or 1)
