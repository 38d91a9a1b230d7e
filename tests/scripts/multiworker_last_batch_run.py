"""Fits Embedding and CNN models on datasets with uneven last batches; saves what each task saw.

Usage: python multiworker_last_batch_run.py OUT_DIR STRATEGY
Run once without TF_CONFIG for the single-process reference, or under
trainer-launch for the multi-worker run (2 workers: 30 examples in global
batches of 12 leave a last batch of 6, 3 per worker, in a fused call; 13
examples leave a last batch of 1, fewer than the workers). The 30 examples
are also given as a batched tf.data.Dataset and as a PyDataset, whose own
batches of 12 are the global batches.
"""

import json
import os

from start import arguments, start

args = arguments(__doc__, ("out", str), ("strategy", str))
out, strategy = args.out, args.strategy
start()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer import Trainer, cluster_info  # noqa: E402

# Multi-worker strategies must exist before TensorFlow runs anything, so the Trainer comes first.
trainer = Trainer(strategy=strategy, batch_size=12, lr_scaling=None, seed=0, verbose=0)
from families import SIZES, as_dataset, make_data, make_model  # noqa: E402

import keras  # noqa: E402


class Batches(keras.utils.PyDataset):
    """Batches of 12 as a PyDataset with two worker threads (each worker reads every batch)."""

    def __init__(self, x, y):
        super().__init__(workers=2)
        self.x, self.y = x, y

    def __len__(self):
        return -(-len(self.y) // 12)

    def __getitem__(self, i):
        return tf.nest.map_structure(lambda a: a[i * 12:(i + 1) * 12], self.x), self.y[i * 12:(i + 1) * 12]


FORMS = {  # how fit reads the data: the trainer batches it, or its own batches are the global batches
    "fused": lambda x, y: as_dataset(x, y),
    "tiny": lambda x, y: as_dataset(x, y),
    "batched": lambda x, y: as_dataset(x, y).batch(12).prefetch(2),
    "pydataset": Batches,
}
results, weights = {}, {}
for family in ("embedding", "cnn"):
    model = make_model(family)
    for case, form in FORMS.items():
        x, y = make_data(family, SIZES.get(case, SIZES["fused"]), seed=0)
        history = trainer.fit(model, form(x, y), epochs=2, shuffle=False)
        results[f"{family}/{case}"] = {"history": history.history,
                                       "evaluate": trainer.evaluate(model, form(x, y), return_dict=True)}
        weights[f"{family}/{case}"] = np.concatenate([w.ravel() for w in model.get_weights()])
info = cluster_info()
task = f"{info.task_type or 'single'}{info.task_id}"
np.savez(os.path.join(out, f"{task}.npz"), **weights)
with open(os.path.join(out, f"{task}.json"), "w") as f:
    json.dump(results, f)
print("done", task)
