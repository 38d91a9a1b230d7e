"""`notebook_launcher`: a function run by local worker processes, from a notebook, and the chief's result."""

from __future__ import annotations

import os
import time
from queue import Empty
from typing import Any, Callable

from trainer.distribute.cluster import LAUNCHER_MARK
from trainer.launch.job import cluster_spec, free_ports
from trainer.launch.supervise import GRACE_SECONDS, tf_config
from trainer.quiet import startup_notices_hidden


def notebook_launcher(fn: Callable[[], Any], workers: int = 2, timeout: float | None = None) -> Any:
    """Runs `fn()` in `workers` local worker processes (one TF_CONFIG each); returns the chief's result.

    The processes are forked, so `fn` may be defined in the notebook. Fork only
    before TensorFlow has run anything in the notebook's own process: build the
    model, data and Trainer inside `fn`.
    """
    import multiprocessing

    context = multiprocessing.get_context("fork")
    cluster = cluster_spec(workers, 0, free_ports(workers))
    queue = context.Queue()
    processes = [context.Process(target=_notebook_task, args=(fn, cluster, i, queue)) for i in range(workers)]
    for p in processes:
        p.start()
    results: dict[int, Any] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while len(results) < workers:
            try:
                index, ok, value = queue.get(timeout=0.5)
            except Empty:
                dead = [i for i, p in enumerate(processes) if p.exitcode is not None and i not in results]
                if dead and queue.empty():
                    raise RuntimeError(f"worker:{dead[0]} exited (code {processes[dead[0]].exitcode}) "
                                       "without returning a result.")
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"notebook_launcher: workers still running after {timeout}s.")
                continue
            if not ok:
                raise RuntimeError(f"worker:{index} failed:\n{value}")
            results[index] = value
    finally:
        for p in processes:
            p.join(timeout=GRACE_SECONDS)
            if p.is_alive():
                p.kill()
    return results[0]


def _notebook_task(fn, cluster, index, queue) -> None:
    import pickle
    import traceback

    os.environ["TF_CONFIG"] = tf_config(cluster, "worker", index)
    os.environ[LAUNCHER_MARK] = "notebook_launcher"
    try:
        with startup_notices_hidden():  # TensorFlow's start-up notices, once per worker, stay off the page
            result = fn()
        pickle.dumps(result)  # fail here, with a message, rather than in the queue's thread
        queue.put((index, True, result))
    except BaseException:  # report any failure to the notebook, with its traceback
        queue.put((index, False, traceback.format_exc()))
