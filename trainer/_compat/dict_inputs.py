"""A dict of data for a model's inputs, checked and fed as Keras does.
"""

from __future__ import annotations

import dataclasses

import keras

from .version import KERAS_GE_3_16

# A dict of data for a model's inputs ----------------------------------------------
#
# Keras checks a dict of data against a model's inputs by name, then feeds it
# by another rule (keras/src/layers/input_spec.py `assert_input_compatibility`
# and keras/src/models/functional.py `_standardize_inputs`; the same on 3.8 and
# 3.15; the dict model's feed by name from 3.16):
# - the check: when every spec of `model.input_spec` has a name (a Functional's
#   Input names, or for a model built on a dict of Inputs its sorted keys),
#   each name must be a key of the data ("Missing data for input"); other keys
#   pass;
# - the feed, for a model built on a list of Inputs: `data[name]` for each
#   input; other keys are ignored;
# - the feed, for a model built on a dict of Inputs: up to 3.15, the data's
#   values in sorted key order, zipped with the inputs in sorted key order
#   (after a warning when the keys differ), so a key beyond the inputs that
#   sorts among them moves the later inputs' data along by one; from 3.16,
#   `data[name]` for each input, after a warning naming the keys ignored
#   (`_match_expected_structure`).
# A Sequential has no input_spec; its Functional, built on one Input, takes
# `data[name]` or fails. Without names, the dict's values go by position,
# sorted by key.


@dataclasses.dataclass(frozen=True)
class DictFeed:
    """How Keras feeds a dict of data to a model's inputs."""

    pairs: list  # (data key, input name, symbolic input) for each input, in `model.inputs`' order
    missing: list  # input names the data lacks (Keras refuses the dict)


def dict_feed(model: keras.Model, keys) -> DictFeed | None:
    """How Keras feeds a dict of data with `keys` to `model`'s inputs; None where it feeds its values by
    position (an input without a name, or a model not built on keras.Input)."""
    try:
        specs = keras.tree.flatten(model.input_spec or [])
        tensors = list(model.inputs or [])
    except (AttributeError, ValueError):
        return None
    names = [getattr(spec, "name", None) for spec in specs]
    if not specs and len(tensors) == 1:  # a Sequential: its Functional takes a dict's data by the input's name
        names = [tensors[0].name]
    if not names or not all(names) or len(names) != len(tensors):
        return None
    missing = [name for name in names if name not in keys]
    struct = getattr(model, "input", None)
    if isinstance(struct, dict):
        inputs = sorted(struct)
        fed = inputs if KERAS_GE_3_16 else sorted(keys)
        return DictFeed(list(zip(fed, inputs, [struct[n] for n in inputs])), missing)
    return DictFeed([(name, name, tensor) for name, tensor in zip(names, tensors)], missing)
