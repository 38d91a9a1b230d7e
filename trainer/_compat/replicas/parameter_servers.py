"""Parameter-server training: an update of a sharded variable from the optimizer's cross-replica apply (its
gradient accumulation, its EMA) writes each shard where it lives (`_compat.sharded`)."""

from __future__ import annotations

import tensorflow as tf

from ..sharded import is_sharded
from .shares import originals


def ps_update(self, var, fn, args, kwargs, group):
    if not is_sharded(var):
        return originals["ps_update"](self, var, fn, args, kwargs, group)
    result = fn(var, *self._select_single_value(args), **self._select_single_value(kwargs))
    return result if group else tf.nest.map_structure(self._local_results, result)
