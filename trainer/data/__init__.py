"""The data side: what the user passed to fit, evaluate or predict, and each replica's share of every step.

- `boundary`: what the user passed -> one input kind, checked (`checks`), `class_weight` applied (`class_weights`);
- `inputs`: the input kinds, each with its whole contract, and the readers the steps consume;
- `feed`: how each replica gets its share of a global step; `arrays`: in-memory arrays, sliced per replica;
- `passes`: the input's passes over its data, cut into epochs as Keras's epoch iterator cuts them.

May import `trainer._compat`, `trainer.distribute` and `trainer.user_line`; never the model or the engine: the
data's own checks run before any model is read. Imported by `trainer.model` (the data against the model),
`trainer.engine` and the facade.
"""
