"""The user's model: where it lives, what its class brings, and the way beneath its own `fit`.

- `placement`: a model built anywhere, moved into the strategy's scope for one call, and back;
- `models`: checks, builders, dtype policies and the scaled optimizer;
- `own_steps`: the steps the model's class brings of its own, and the names of what they log;
- `checks`: the data against the model's inputs and outputs;
- `route`: a model's own fit, evaluate, predict and `*_on_batch`, run on the trainer's engine.

May import `trainer._compat`, `trainer.distribute`, `trainer.data`, `trainer.scaling` and `trainer.user_line`.
Imported by `trainer.engine` and the facade.
"""
