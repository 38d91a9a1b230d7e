"""trainer: a Keras-style trainer for TensorFlow distribution strategies.

The same script trains on one device, many GPUs or many machines, with the same
numbers at one global batch: losses and metrics are aggregated exactly across replicas.

Names are imported on first use, so `trainer-launch` starts without loading
TensorFlow. The distribution is `keras-strategy-trainer`: on the package registry
the name `trainer` is Coqui's PyTorch trainer, which installs an import package
`trainer` too (`_alone`).
"""

import importlib
import os
from importlib import metadata

DISTRIBUTION = "keras-strategy-trainer"


def _alone() -> None:
    """Refuses to load beside another distribution that installed its own `trainer` package in this
    environment (the registry's `trainer`, Coqui's PyTorch trainer): pip writes one's files over the other's,
    so neither is whole. Only an installed copy counts: its RECORD lists `trainer/__init__.py`."""
    try:
        other = metadata.distribution("trainer")
    except metadata.PackageNotFoundError:
        return
    if not any(line.startswith("trainer/__init__.py,") for line in (other.read_text("RECORD") or "").splitlines()):
        return
    raise ImportError(
        f"Another distribution named `trainer` (version {other.version}: on the package registry, Coqui's "
        f"PyTorch trainer) is installed in this environment, and it has an import package `trainer` too, so pip "
        f"wrote one's files over the other's. Keep them in separate virtual environments: here, run `pip "
        f"uninstall -y trainer {DISTRIBUTION}`, then install {DISTRIBUTION} again.")


_alone()


def _callbacks_of_a_checkout() -> None:
    """Lets `trainer.callbacks` import from a clone of the repository, whose callbacks/ folder sits beside this
    one (setup.cfg's package_dir installs it as trainer.callbacks). Python started in the clone's root imports
    this folder, not the installed package, even after `pip install .`; without this, every `fit` there failed
    on `import trainer.callbacks`. An installed package has trainer/callbacks/ and is left as it is."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    if not os.path.isdir(os.path.join(here, "callbacks")) and os.path.isfile(os.path.join(root, "callbacks",
                                                                                          "__init__.py")):
        __path__.append(root)  # the clone's top-level folders become findable below `trainer.`: callbacks/


_callbacks_of_a_checkout()

_EXPORTS = {
    "Trainer": "trainer.trainer",
    "History": "trainer.history",
    "TrainContext": "trainer.engine.context",
    "Plan": "trainer.engine.plan",
    "BatchPlan": "trainer.scaling",
    "ScaledSchedule": "trainer.scaling",
    "STRATEGY_NAMES": "trainer.distribute.strategy",
    "resolve_strategy": "trainer.distribute.strategy",
    "ClusterInfo": "trainer.distribute.cluster",
    "cluster_info": "trainer.distribute.cluster",
    "parse_tf_config": "trainer.distribute.cluster",
    "notebook_launcher": "trainer.launch.notebook",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
