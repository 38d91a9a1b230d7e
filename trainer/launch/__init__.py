"""Starting a job's processes the way clusters start them, and keeping them together.

- `launcher`: the `trainer-launch` command (`python -m trainer.launch`): its flags, checked before anything starts;
- `job`: a job's rounds on this machine, one process per task with TF_CONFIG for each, and its restarts;
- `supervise`: one machine's tasks: their processes, their output, and the loop that watches them;
- `rendezvous` and `links`: the machines of a job without a scheduler, meeting at node 0 and kept linked;
- `agreement` and `secret`: what the machines agree on there, and the shared secret each proves it holds;
- `serve`: the tasks that serve rather than run the script (a parameter-server cluster's workers and ps);
- `notebook`: `notebook_launcher`, a function run by local worker processes from a notebook.

Starts without TensorFlow: the launcher loads it in the tasks alone. May import `trainer.distribute`,
`trainer._compat` and `trainer.quiet`, and `trainer.engine.malloc` for the tasks that serve. Imported by no
other folder: the facade names `notebook_launcher` (`trainer/__init__.py`).
"""
