"""graph_function: TensorFlow's retracing warning fires for a function that retraces, not for new functions."""

import logging

import tensorflow as tf

from trainer.engine.tracing import graph_function


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _retracing_warnings(run) -> list[str]:
    records, logger = _Records(), logging.getLogger("tensorflow")
    logger.addHandler(records)
    try:
        run()
    finally:
        logger.removeHandler(records)
    return [m for m in records.messages if "retracing" in m]


def test_functions_traced_once_each_do_not_warn():
    def new_models():
        for _ in range(8):  # as a session that builds and fits eight models: each its own reader
            variable = tf.Variable(1.0)
            read = graph_function(lambda: variable + 1.0)
            assert float(read()) == 2.0

    assert _retracing_warnings(new_models) == []


def test_one_function_that_retraces_still_warns():
    double = graph_function(lambda n: n * 2)
    warnings = _retracing_warnings(lambda: [double(n) for n in range(8)])  # a new Python int: a new trace each
    assert warnings and "triggered tf.function retracing" in warnings[0]


def test_traced_graphs_keep_the_function_name():
    def train_loop():
        return tf.constant(1)

    assert "train_loop" in graph_function(train_loop).get_concrete_function().name.decode()
