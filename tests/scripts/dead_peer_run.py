"""Two workers without the launcher; worker 1 dies at step 5. Used by test_multiworker.py."""

import json
import os
import signal

from start import arguments, start

arguments(__doc__)
start()

from trainer import Trainer, resolve_strategy  # noqa: E402

trainer = Trainer(strategy=resolve_strategy("multi_worker", timeout_seconds=5), batch_size=64, verbose=0)

import keras  # noqa: E402
from tiny import tiny_data, tiny_model  # noqa: E402


class Die(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1 and batch == 5:
            os.kill(os.getpid(), signal.SIGKILL)


x, y, w = tiny_data(4000)
trainer.fit(tiny_model(), (x, y), epochs=3, callbacks=[Die()])
