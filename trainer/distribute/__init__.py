"""Where a job runs: the task's place in its cluster and the strategy it trains under.

- `cluster`: the task's place, from TF_CONFIG, Slurm's environment or a strategy's resolver;
- `slurm`: the tasks of a Slurm job step (`srun`);
- `gpus`: which of a machine's GPUs each local worker computes on (pure Python, for the launcher too);
- `strategy`: strategy names and options -> `tf.distribute.Strategy`, and which strategy a model goes with;
- `collectives`: distinct collective keys for the MirroredStrategies of one process;
- `faults`: what a failed collective means, said as what to do;
- `ambient`: the strategies a call finds around it (the user's scope, its data's, the model's home);
- `chatter`: TensorFlow's INFO lines and, off the chief, Keras's warnings hidden while a call runs.

May import `trainer._compat` and nothing else of the trainer. Imported by every folder above it
(`data`, `model`, `engine`, `launch`), by `trainer.callbacks` and by the facade.
"""
