"""Prints the installed distributions that write the `keras` package, and fails unless there is exactly one,
and unless the trainer's own check (`trainer._compat.version.keras_owners`, which knows two names) finds it too.

`keras` and `keras-nightly` both provide it: installed together, pip writes one's files over the other's, and
`pip check` does not see it (.ci/wheel). This reads every distribution's RECORD, so it checks that check too.
"""

import sys
from importlib import metadata


def writes_keras(dist) -> bool:
    return any(line.startswith("keras/__init__.py,") for line in (dist.read_text("RECORD") or "").splitlines())


owners = sorted({dist.metadata["Name"] for dist in metadata.distributions() if writes_keras(dist)})
print("the keras package comes from:", ", ".join(owners) or "nothing")
if len(owners) != 1:
    sys.exit(f"expected one distribution writing keras/, found {owners}")

from trainer._compat.version import keras_owners  # noqa: E402  (imports TensorFlow: only for a whole install)

found = [owner.split()[0] for owner in keras_owners()]
sys.exit(0 if found == owners else f"the trainer's check finds {found}, the RECORDs {owners}")
