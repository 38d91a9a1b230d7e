"""The save step that workers agree on after a SIGTERM (`callbacks/_preemption.py`), over an in-memory store.

The real store, the coordination service's, is exercised by two workers in
`test_multiworker.py::test_a_sigterm_to_one_worker_makes_every_worker_save_the_same_step`.
"""

import threading
import time

import pytest

from trainer import _compat
from trainer.callbacks import _preemption


class Store:
    """Keys set once, and reads that wait for them: what the coordination service's store does."""

    def __init__(self):
        self.values, self.changed = {}, threading.Condition()

    def put(self, key, value):
        with self.changed:
            if key in self.values:
                return False
            self.values[key] = value
            self.changed.notify_all()
            return True

    def get(self, key, timeout_seconds):
        with self.changed:
            self.changed.wait_for(lambda: key in self.values, timeout=timeout_seconds)
            return self.values.get(key)


@pytest.fixture
def store(monkeypatch):
    store = Store()
    monkeypatch.setattr(_compat, "put_cluster_key", store.put)
    monkeypatch.setattr(_compat, "cluster_key", store.get)
    monkeypatch.setattr(_preemption, "POLL_SECONDS", 0.05)
    return store


def _workers(count):
    return [_preemption.SaveStep(index, count, fit=1) for index in range(count)]


def _wait_for(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_the_worker_told_names_the_next_boundary_and_every_worker_learns_it(store):
    chief, worker = _workers(2)
    try:
        assert not chief.due(7) and not worker.due(7)
        assert worker.propose(7) == 8  # returns once both have acknowledged
        assert chief.target == 8 and worker.target == 8
        assert not chief.due(7) and chief.due(8) and worker.due(8)
    finally:
        chief.close(), worker.close()


def test_a_worker_told_later_follows_the_boundary_named_first(store):
    chief, worker = _workers(2)
    try:
        assert worker.propose(7) == 8
        assert chief.propose(8) == 8  # the chief's own SIGTERM came at its next boundary: it still saves at 8
    finally:
        chief.close(), worker.close()


def test_a_worker_that_never_acknowledges_leaves_the_others_to_save_where_they_are(store, monkeypatch):
    monkeypatch.setattr(_preemption, "ACK_SECONDS", 0.2)
    chief, gone = _workers(2)
    gone.close()  # its machine is gone: nothing of it reads the store any more
    try:
        assert chief.propose(3) is None
        assert f"{gone._ack}/1" not in store.values
    finally:
        chief.close()


def test_each_fit_agrees_under_keys_of_its_own(store):
    first, second = _preemption.SaveStep(0, 1, fit=1), _preemption.SaveStep(0, 1, fit=2)
    try:
        assert first.propose(2) == 3
        assert second.target is None and second.propose(5) == 6
    finally:
        first.close(), second.close()


def test_closing_stops_the_watcher_thread(store):
    (step,) = _workers(1)
    step.close()
    assert _wait_for(lambda: not step._watcher.is_alive(), seconds=1.0)
