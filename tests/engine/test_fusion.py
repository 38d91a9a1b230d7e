"""Step fusion: fixed, or sized from the measured time per step."""

from trainer.engine.fusion import FIRST_AUTO_STEPS, MAX_AUTO_STEPS, MULTI_WORKER_STEPS, TARGET_CALL_SECONDS, StepFusion


def test_fixed_fusion_never_changes():
    fusion = StepFusion(7)
    for seconds in (5.0, 0.001, 0.3):
        fusion.observe(7, seconds)
    assert fusion.steps == 7


def test_auto_ignores_the_tracing_call_then_sizes_calls_to_the_target():
    fusion = StepFusion.sized_from_step_time()
    assert fusion.steps == FIRST_AUTO_STEPS
    fusion.observe(FIRST_AUTO_STEPS, 30.0)  # tracing: ignored
    assert fusion.steps == FIRST_AUTO_STEPS
    fusion.observe(4, 0.04)  # 10 ms per step
    assert fusion.steps == round(TARGET_CALL_SECONDS / 0.01)
    fusion.observe(fusion.steps, fusion.steps * 0.05)  # slower steps: fewer per call
    assert fusion.steps == round(TARGET_CALL_SECONDS / 0.05)


def test_auto_is_bounded_and_ignores_empty_calls():
    fusion = StepFusion.sized_from_step_time()
    fusion.observe(4, 1.0)
    fusion.observe(4, 1e-7)
    assert fusion.steps == MAX_AUTO_STEPS
    fusion.observe(10, 100.0)
    assert fusion.steps == 1
    fusion.observe(0, 0.0)
    assert fusion.steps == 1


def test_fit_fusion_follows_the_setting_callbacks_and_workers():
    assert StepFusion.for_fit(8, batch_hooks=True, steps_per_epoch=100, num_workers=2) == StepFusion(8)
    assert StepFusion.for_fit("auto", batch_hooks=True, steps_per_epoch=100, num_workers=1) == StepFusion(1)
    assert StepFusion.for_fit("auto", batch_hooks=False, steps_per_epoch=100, num_workers=2) == StepFusion(
        MULTI_WORKER_STEPS)
    # Across workers, an epoch shorter than the fixed count caps it; an unknown one does not.
    assert StepFusion.for_fit("auto", batch_hooks=False, steps_per_epoch=10, num_workers=2).steps == 10
    unknown = StepFusion.for_fit("auto", batch_hooks=False, steps_per_epoch=None, num_workers=3)
    assert unknown.steps == MULTI_WORKER_STEPS
    single = StepFusion.for_fit("auto", batch_hooks=False, steps_per_epoch=100, num_workers=1)
    assert (single.steps, single.auto) == (FIRST_AUTO_STEPS, True)


def test_auto_starts_from_a_known_step_time():
    assert StepFusion.sized_from_step_time(0.02).steps == round(TARGET_CALL_SECONDS / 0.02)
    fit = StepFusion.for_fit("auto", batch_hooks=False, steps_per_epoch=100, num_workers=1, seconds_per_step=0.004)
    assert (fit.steps, fit.auto) == (round(TARGET_CALL_SECONDS / 0.004), True)
    fit.observe(fit.steps, 30.0)  # the fit's first call still only starts the pipeline: ignored
    assert fit.steps == round(TARGET_CALL_SECONDS / 0.004)
    fixed = StepFusion.for_fit(8, batch_hooks=False, steps_per_epoch=100, num_workers=1, seconds_per_step=0.004)
    assert fixed == StepFusion(8)


def test_a_second_fit_starts_at_the_size_the_first_measured():
    import keras
    import numpy as np

    from tiny import tiny_data, tiny_model
    from trainer import Trainer

    class Calls(keras.callbacks.Callback):
        handles_fused_steps = True

        def set_trainer_context(self, context):
            self.context, self.ends = context, []

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(self.context.step)

    x, y, _ = tiny_data(50 * 8)
    trainer = Trainer(strategy="default", batch_size=8, verbose=0)  # steps_per_execution="auto"
    model = tiny_model()
    first, second = Calls(), Calls()
    trainer.fit(model, (x, y), epochs=2, callbacks=[first])
    measured = first.context.fusion.seconds_per_step
    assert first.ends[0] == FIRST_AUTO_STEPS and measured > 0
    trainer.fit(model, (x, y), epochs=1, callbacks=[second])
    expected = min(50, StepFusion.sized_from_step_time(measured).steps)
    assert expected > FIRST_AUTO_STEPS and second.ends[0] == expected
    assert np.diff([0] + second.ends).sum() == 50
