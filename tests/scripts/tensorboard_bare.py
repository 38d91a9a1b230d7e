"""In a venv without the `tensorboard` package, as every TensorFlow from 2.18 to 2.22 leaves it (.ci/wheel):
trainer.callbacks.TensorBoard writes its event files, while Keras's own TensorBoard callback can't write
(docs/ecosystem.md). Fails if either is otherwise."""

import glob
import importlib.util
import sys

import keras
import numpy as np

from trainer import Trainer
from trainer.callbacks import TensorBoard

if importlib.util.find_spec("tensorboard") is not None:
    sys.exit("tensorboard is installed here: docs/ecosystem.md says no TensorFlow installs it")
x, y = np.random.rand(64, 8).astype("float32"), np.random.randint(0, 2, 64)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
Trainer(verbose=0).fit(model, x, y, epochs=2, callbacks=[TensorBoard("logs")])
events = glob.glob("logs/train/events.out.tfevents.*")
if not events:
    sys.exit(f"trainer.callbacks.TensorBoard wrote no event file under logs/train: {glob.glob('logs/**')}")
try:
    model.fit(x, y, epochs=1, verbose=0, callbacks=[keras.callbacks.TensorBoard("keras-logs")])
except Exception as err:  # TensorFlow's TBNotInstalledError
    if "TensorBoard is not installed" not in str(err):
        raise
else:
    sys.exit("Keras's own TensorBoard callback wrote without tensorboard: docs/ecosystem.md says it can't")
print("without tensorboard: trainer.callbacks.TensorBoard wrote", events[0], "and Keras's own refused")
