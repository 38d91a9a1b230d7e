"""What an element spec tells without reading the data: a spec's rank, and whether elements hold ragged or
sparse tensors. The kinds, the readers and the checks ask it alike, so it imports none of them."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def has_composite(element_spec: Any) -> bool:
    """Whether elements of `element_spec` hold ragged or sparse tensors."""
    return any(isinstance(spec, (tf.RaggedTensorSpec, tf.SparseTensorSpec)) for spec in tf.nest.flatten(element_spec))


def spec_rank(spec: Any, absent: Any = None) -> int | None:
    """A spec's rank (None: unknown); `absent` for the spec of what is always None (`NoneTensorSpec`, an optional
    input's absence), which has no shape."""
    return spec.shape.rank if hasattr(spec, "shape") else absent
