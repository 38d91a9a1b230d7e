"""What a model's own train_step costs through the Trainer, against Keras's fit running the same step.

    python bench/own_step.py [--examples 12800] [--repeats 3] [--out FILE]

The model is the Fashion-MNIST example's CNN, as a `keras.Model` subclass whose
`train_step` is the Keras guide's ("Customizing what happens in fit()"):
forward pass, `compute_loss`, gradient tape, `optimizer.apply`,
`compute_metrics`. Variants, each with no strategy and with MirroredStrategy
over 2 logical CPU devices, timed epoch by epoch and interleaved as in
bench/throughput.py (the ratios are the Trainer's, round by round):

  trainer          Trainer.fit on the subclass: the model's own train_step
  trainer_builtin  Trainer.fit on the same layers without the override: the trainer's step
  keras_fit        keras Model.fit on the subclass, jit_compile=False and
                   steps_per_execution=32 (1 under MirroredStrategy, where Keras
                   fails with more), the Trainer's own settings on CPU
"""

from __future__ import annotations

import throughput

def _guide_step_model():
    import keras
    import tensorflow as tf

    from fashion_mnist import build_model

    class GuideStep(keras.Model):
        def train_step(self, data):
            x, y = data[:2]
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            return self.compute_metrics(x, y, y_pred)

    layers = build_model()
    model = GuideStep(layers.inputs, layers.outputs)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=layers.loss, metrics=["accuracy"])
    return model


def runners(strategy, x, y) -> dict:
    import variants

    own = variants.trainer(strategy, x, y)
    own.model = _guide_step_model()

    def keras_epoch() -> int:
        keras_model.fit(x, y, batch_size=variants.PER_REPLICA * strategy.num_replicas_in_sync, epochs=1, verbose=0)
        return len(x)

    with strategy.scope():
        keras_model = _guide_step_model()
        fused = variants.FUSED_STEPS if strategy.num_replicas_in_sync == 1 else 1
        keras_model.compile(optimizer=keras_model.optimizer, loss=keras_model.loss, metrics=["accuracy"],
                            jit_compile=False, steps_per_execution=fused)
    return {"trainer": own, "trainer_builtin": variants.trainer(strategy, x, y),
            "keras_fit": variants._Runner(keras_epoch)}


def _report(layout: str, measured: dict) -> None:
    print(f"{layout}: own train_step through the Trainer / each: "
          + ", ".join(f"{k} {v:.3f}x" for k, v in measured["trainer_ratio"].items()), flush=True)


def main() -> None:
    throughput.run_layouts(__doc__.split("\n")[0], runners, _report)


if __name__ == "__main__":
    main()
