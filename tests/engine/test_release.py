"""The train loop hands spent iterators to a helper thread, so their teardown never stalls training."""

import threading

from trainer.engine import eval_loop


class _SlowToDestroy:
    """Stands in for a tf.data iterator whose destruction waits (TensorFlow's autotuner, on TF 2.21)."""

    def __init__(self, go: threading.Event, seen: dict):
        self.go, self.seen = go, seen

    def __del__(self):
        self.seen["thread"] = threading.current_thread().name
        self.seen["released_first"] = self.go.wait(timeout=5)  # True only if _release returned first


def test_release_destroys_iterators_on_a_helper_thread_without_waiting():
    go, seen = threading.Event(), {}
    held = [_SlowToDestroy(go, seen)]
    eval_loop.release(held)
    assert held == []  # the loop may hold a new iterator at once
    go.set()
    for thread in threading.enumerate():
        if thread.name == "trainer-release-iterator":
            thread.join(timeout=10)
    assert seen == {"thread": "trainer-release-iterator", "released_first": True}


def test_release_of_nothing_starts_no_thread():
    before = threading.active_count()
    eval_loop.release([])
    assert threading.active_count() == before
