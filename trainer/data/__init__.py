"""The data side: what the user passed to fit, evaluate or predict, and each replica's share of every step.

- `boundary`: what the user passed -> one input kind, checked (`checks`), `class_weight` applied (`class_weights`);
  arrays read by `user_arrays`, what Keras's adapters read by `keras_forms`, predict's features by `features`;
- `inputs`: the input kinds as one type, and `Readers`; the kinds by family in `array_input`, `dataset_inputs` and
  `pipeline_inputs`, on the base of `input_kind`;
- `readers`: the readers step calls consume; `feed`: each replica's share of a global step, inside the step;
  `arrays`: in-memory arrays, sliced per replica; `specs`: what an element spec tells;
- `passes`: the input's passes over its data, cut into epochs as Keras's epoch iterator cuts them.

May import `trainer._compat`, `trainer.distribute` and `trainer.user_line`; never the model or the engine: the
data's own checks run before any model is read. Imported by `trainer.model` (the data against the model),
`trainer.engine` and the facade.
"""
