"""Prints the installed distributions that write the `keras` package, and fails unless there is exactly one.

`keras` and `keras-nightly` both provide it: installed together, pip writes one's files over the other's, and
`pip check` does not see it (.ci/wheel).
"""

import sys
from importlib import metadata



def writes_keras(dist) -> bool:
    return any(line.startswith("keras/__init__.py,") for line in (dist.read_text("RECORD") or "").splitlines())


owners = sorted({dist.metadata["Name"] for dist in metadata.distributions() if writes_keras(dist)})
print("the keras package comes from:", ", ".join(owners) or "nothing")
sys.exit(0 if len(owners) == 1 else f"expected one distribution writing keras/, found {owners}")
