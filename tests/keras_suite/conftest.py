"""What Keras's test files import from Keras's root conftest.py, which its source distribution leaves out.

Only the tier's own runs (keras_plugin.py) see this file: tests/conftest.py keeps the project's suite out of
this folder.
"""

import pytest
from keras.src import backend


def skip_if_backend(given_backend: str, reason: str):
    return pytest.mark.skipif(backend.backend() == given_backend, reason=reason)
