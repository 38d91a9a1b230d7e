"""Fits Embedding and CNN models on datasets with uneven last batches; saves what each task saw.

Usage: python multiworker_last_batch_run.py OUT_DIR STRATEGY
Run once without TF_CONFIG for the single-process reference, or under
trainer-launch for the multi-worker run (2 workers: 30 examples in global
batches of 12 leave a last batch of 6, 3 per worker, in a fused call; 13
examples leave a last batch of 1, fewer than the workers).
"""

import json
import os
import sys

import numpy as np

from trainer import Trainer, cluster_info

out, strategy = sys.argv[1], sys.argv[2]
# Multi-worker strategies must exist before TensorFlow runs anything, so the Trainer comes first.
trainer = Trainer(strategy=strategy, batch_size=12, lr_scaling=None, seed=0, verbose=0)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from families import SIZES, as_dataset, make_data, make_model  # noqa: E402

results, weights = {}, {}
for family in ("embedding", "cnn"):
    model = make_model(family)
    for case in ("fused", "tiny"):
        x, y = make_data(family, SIZES[case], seed=0)
        history = trainer.fit(model, as_dataset(x, y), epochs=2)
        results[f"{family}/{case}"] = {"history": history.history,
                                       "evaluate": trainer.evaluate(model, as_dataset(x, y))}
        weights[f"{family}/{case}"] = np.concatenate([w.ravel() for w in model.get_weights()])
info = cluster_info()
task = f"{info.task_type or 'single'}{info.task_id}"
np.savez(os.path.join(out, f"{task}.npz"), **weights)
with open(os.path.join(out, f"{task}.json"), "w") as f:
    json.dump(results, f)
print("done", task)
