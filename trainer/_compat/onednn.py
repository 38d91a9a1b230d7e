"""Whether TensorFlow's CPU kernels use oneDNN.
"""

from __future__ import annotations

import functools


from trainer.quiet import startup_notices_hidden

@functools.cache  # TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, when it starts
def onednn_enabled() -> bool | None:
    """Whether TensorFlow's CPU kernels use oneDNN in this process (None if TF does not say).

    `tensorflow/python/util/_pywrap_util_port.IsMklEnabled` (2.5-2.22), which
    logs "oneDNN custom operations are on" at every call on TensorFlow 2.18:
    this probe's own notice is kept off the screen (`quiet`).
    """
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:  # pragma: no cover
        return None
    is_enabled = getattr(_pywrap_util_port, "IsMklEnabled", None)
    if is_enabled is None:
        return None
    with startup_notices_hidden():
        return bool(is_enabled())
