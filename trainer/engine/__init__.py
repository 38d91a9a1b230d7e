"""The engine: one (model, strategy) pair's step functions, and the loops that call them.

- `engine`: the model and optimizer in scope, the trackers, the compiled steps;
- `steps`: the replica step functions and the fused loops that run them; `fusion`: how many steps a call runs;
- `objective`: the model's loss and metrics, exact across replicas; `draws`: random draws as one device draws them
  (`draw_shapes` reads their shapes, `draw_names` names those that are not one device's);
- `loop`: the epoch loop, callbacks around the fused calls; `eval_loop`: evaluation's and prediction's pass;
  `callback_hooks`: what a callback asks of them; `ps`: the epochs on a ParameterServerStrategy, scheduled by a
  ClusterCoordinator;
- `plan`: what a call will run, and why, printed once; `tracing`: how the graphs are traced;
- `malloc`: the process's allocator, raised over the setting tf.data pins, which halves CPU step speed.

May import every folder below it (`trainer._compat`, `trainer.distribute`, `trainer.data`, `trainer.model`) and
the ground modules (`trainer.quiet`, `trainer.scaling`, `trainer.user_line`). Imported by the facade, by
`trainer.callbacks` (`tracing`) and by `trainer.launch` (`malloc`, for the tasks that serve).
"""
