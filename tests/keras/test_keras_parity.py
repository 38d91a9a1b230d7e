"""Keras parity: everyday model.fit patterns give model.fit's numbers through Trainer.fit.

One row per pattern (tests/helpers/parity_cases.py): the model's own train_step,
test_step, compute_loss and compute_metrics; masks; per-time-step sample
weights and the reported loss; Keras's metric names and the callbacks that
look metrics up by name; custom losses and metrics that Keras never
registered; add_loss and activity regularizers; models that no config can
re-create (a VAE without call(), a distiller, a Lambda layer). Each row is
fitted by model.fit on one device and by Trainer.fit, given the user's own
instance built outside any scope, with the same seed, global batch and data,
on 1, 2 and 3 replicas, 8 for random layers and BatchNormalization, the
same through the reader that GPUs use, and on 2 workers (one process per
layout, tests/scripts/parity_run.py), with a last batch split unevenly (CI's tier runs
every row on 2 replicas and some on the others: `CI`); history, final
weights, the stepped optimizers' state, evaluate and predict must agree to 1e-5,
and history must have model.fit's keys, no more. Both runs make the same
calls, `model.fit(x, y, batch_size=8, ...)` and `trainer.fit(model, x, y,
batch_size=8, ...)`, with the data as arrays, a batched tf.data.Dataset, a
generator or a PyDataset, and fit's Keras arguments (class_weight,
validation_split, validation_freq, ...).
"""

import concurrent.futures
import os
import pickle
import sys

import keras
import numpy as np
import pytest

from conftest import FULL, run_script, SCRIPTS, TESTS
from trainer import _compat
from trainer.data import readers

sys.path.insert(0, str(TESTS))
import parity_cases  # noqa: E402

ALL = list(parity_cases.CASES)
# Random layers and BatchNormalization: one device's draws and statistics on every layout (issue 39).
RANDOM = ["dropout_noise_layers", "random_layers_xla", "image_augmentation_spatial_dropout", "gan_random_noise",
          "mixed_random_and_batch_norm", "batch_norm_momentum", "batch_norm_own_train_step",
          "dataset_unknown_size_adam_dropout"]
# Three replicas split 8 as 3+3+2 and the last 5 as 2+2+1: the rows where that matters.
UNEVEN = ["class_weighted_loss", "activity_regularizer", "add_loss_mean", "masking_timedistributed",
          "embedding_mask_zero_tagger", "per_timestep_sample_weight", "two_outputs_dict",
          "own_steps_no_compiled_loss", "compute_loss_penalty", "global_clipnorm", "gradient_accumulation",
          "train_step_global_clipnorm", "gan_two_optimizers", "padded_seq2seq", "vae_no_call",
          "distiller_teacher_in_compute_loss", "fitted_twice", "custom_objects_with_required_arguments",
          "lambda_layer", "saved_and_reloaded", "train_step_returns_loss_tensors", "endpoint_layer_loss",
          "embedding_mask_zero_xla", "steps_per_epoch_below_the_arrays", "steps_per_epoch_below_a_dataset",
          "ragged_token_ids", "sparse_features", "examples_seen_summed", *RANDOM]
# (replicas in each process, how the processes run): "" one process; "accelerator" one process whose CPU
# replicas read as GPUs and TPUs do (TensorFlow's distributed iterator: TRAINER_ACCELERATOR_READER=1);
# "workers" two processes under trainer-launch, each with its replicas ("workers-accelerator": 2 replicas
# each, reading as GPUs do: two machines of 2 GPUs). Eight replicas take a batch of 8 as 1 each; the last
# batch of 5 is computed whole by every replica, and each counts its own row of it (three count none).
# Through the accelerator reader: every input form, masks, an Embedding, the model's own steps, and the rest.
ACCELERATOR = ["dense_l2_mae", "batched_dataset", "batched_dataset_drop_remainder", "generator", "pydataset_workers",
               "string_dataset", "dict_inputs_by_key", "class_weight", "validation_split",
               "evaluate_predict_steps_dataset", "embedding_mask_zero_tagger", "masking_timedistributed",
               "two_outputs_dict", "train_step_guide_custom_model", "gan_two_optimizers", "vae_no_call",
               "endpoint_layer_loss", "steps_per_epoch_below_a_dataset", "steps_per_execution_past_steps_per_epoch",
               "ragged_token_ids", "sparse_features", "examples_seen_summed", *RANDOM]
# On 8 replicas through the accelerator reader, the last batch of 5 is handed whole to each replica.
SMALL_LAST_BATCH = ["dropout_noise_layers", "mixed_random_and_batch_norm", "batch_norm_own_train_step"]
LAYOUTS = {(1, ""): ALL, (2, ""): ALL, (3, ""): UNEVEN, (8, ""): RANDOM, (2, "accelerator"): ACCELERATOR,
           (3, "accelerator"): [c for c in ACCELERATOR if c in UNEVEN], (8, "accelerator"): SMALL_LAST_BATCH,
           (1, "workers"): RANDOM, (2, "workers-accelerator"): [*RANDOM, "embedding_mask_zero_tagger",
                                                                 "batched_dataset", "ragged_token_ids",
                                                                 "sparse_features", "examples_seen_summed"]}
# CI's tier runs every row on 2 replicas, the hooked ones (COMPAT) and a few others on one device, and a few rows
# on 3 replicas and through the accelerator reader (8 replicas and two workers of 2 left CI for the full tier on
# 2026-12-02, when CI on an AVX2-only machine ran past its 90 minutes): a loss weighted by class and by time
# step, the model's own steps, random draws and BatchNormalization, a generator, masks, steps_per_epoch over a
# dataset, ragged and sparse x. The full tier (TRAINER_TESTS=full) runs every row of every layout.
FEW = ["class_weighted_loss", "per_timestep_sample_weight", "gan_two_optimizers", "dropout_noise_layers",
       "batch_norm_momentum", "generator", "embedding_mask_zero_tagger", "steps_per_epoch_below_a_dataset",
       "ragged_token_ids", "sparse_features", "dataset_unknown_size_adam_dropout"]
# Rows that go through Keras's private code the trainer hooks (trainer/_compat/: clipping, accumulation, EMA, the
# compiled loss and metrics, masks, random draws, BatchNormalization's moments, updates summed over replicas), and
# the model's own steps.
COMPAT = ["clipnorm", "global_clipnorm", "clipvalue", "gradient_accumulation", "ema_overwrite",
          "train_step_global_clipnorm", "train_step_gradient_accumulation", "add_loss_mean", "activity_regularizer",
          "masking_timedistributed", "metric_names", "test_step_override", "compute_metrics_override",
          "train_step_guide_custom_model", "dict_inputs_by_key", "compile_steps_per_execution", "random_layers_xla",
          "mixed_random_and_batch_norm", "vae_no_call", "examples_seen_summed"]
# On one device CI's tier runs these and FEW: every row is compared with model.fit on one device on 2 replicas.
ONE_DEVICE = [c for c in ALL if c in FEW or c in COMPAT]
CI = {layout: ONE_DEVICE if layout == (1, "") else cases if layout == (2, "") else
      [c for c in cases if c in FEW] if layout in [(3, ""), (2, "accelerator")]
      else [] for layout, cases in LAYOUTS.items()}
if os.environ.get("PARITY_LAYOUTS") == "core":  # the oldest versions' tier (.ci/oldest): the hooked rows
    LAYOUTS = CI = {(1, ""): ONE_DEVICE, (2, ""): [c for c in ALL if c in FEW]}
RUN = LAYOUTS if FULL else CI
# Rows whose model.fit reference is wrong on an older Keras: (the first Keras that gets it right, what goes wrong).
KERAS_BUGS = {
    "masking_timedistributed": ((3, 9), "Keras's TimeDistributed fails on a mask in a graph (before Keras 3.9)"),
    "test_step_override": ((3, 14), "before Keras 3.14, model.evaluate returns a test_step's nested CompileMetrics "
                                    "dict as it is, and fit's callbacks flatten it into the training metrics' names"),
}
KERAS = _compat.KERAS_VERSION
# Rows where Keras's own compiled model.fit is wrong, and the trainer gives the right numbers: (the history and
# evaluate keys it gets wrong, why). docs/exactness.md says more.
KERAS_WRONG = {
    "two_outputs_dict": (frozenset({"a_loss", "b_loss"}),
                         "each output's loss tracker weighs a batch by the traced step's static batch size: 1 where "
                         "it is unknown (3.8-3.15: every batch, a mean over batches; 3.16: the last batch), the "
                         "batch's size in an eager run (the trainer's, a mean over examples, as the total loss)"),
}


def _run(layout: tuple[int, str], cases: list[str], folder, references: list[str] = ()) -> dict:
    """The layout's runs of `cases`, and model.fit's alone of `references` (on 1 replica: other layouts' rows)."""
    replicas, how = layout
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if "accelerator" in how:
        env[readers.ACCELERATOR_READER] = "1"
    out = folder / f"{replicas}{how}.pkl"
    workers = "workers" in how
    run_script(SCRIPTS / "parity_run.py", replicas, ",".join(cases), out, ",".join(references),
               launch=("--workers", 2) if workers else (), env=env, timeout=900, cwd=TESTS)
    if workers:
        runs = []
        for task in (0, 1):
            with open(f"{out}.worker{task}", "rb") as f:
                runs.append(pickle.load(f))
        for case in cases:  # the workers agree exactly
            assert "error" in runs[0][case] or _flat(runs[0][case]["trainer"]) == _flat(runs[1][case]["trainer"]), case
        return runs[0]
    with open(out, "rb") as f:
        return pickle.load(f)


def _flat(run) -> list:
    return [np.asarray(leaf).tobytes() for leaf in keras.tree.flatten(run)]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    # model.fit's runs come from the 1-replica process only: they are the same on every layout.
    folder = tmp_path_factory.mktemp("parity")
    references = sorted({c for cases in RUN.values() for c in cases} - set(RUN[(1, "")]))
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:  # mostly single-threaded tracing
        futures = {layout: pool.submit(_run, layout, cases, folder, references if layout == (1, "") else [])
                   for layout, cases in RUN.items() if cases or layout == (1, "")}
        return {layout: future.result() for layout, future in futures.items()}


def _layout_id(layout: tuple[int, str]) -> str:
    replicas, how = layout
    if "workers" in how:
        return f"2workers-x{replicas}" + how[len("workers"):]
    return f"{replicas}replicas" + (f"-{how}" if how else "")


@pytest.mark.slow
@pytest.mark.parametrize("layout,case", [
    pytest.param(layout, c, marks=() if c in CI[layout] else pytest.mark.full)
    for layout, cases in LAYOUTS.items() for c in cases], ids=lambda v: _layout_id(v) if isinstance(v, tuple) else v)
def test_trainer_fit_gives_model_fit_numbers(results, layout, case):
    if case in KERAS_BUGS and KERAS < KERAS_BUGS[case][0]:
        pytest.skip(f"Keras {keras.version()}: {KERAS_BUGS[case][1]}")
    replicas = layout[0] * (2 if "workers" in layout[1] else 1)
    reference, result = results[(1, "")][case], results[layout][case]
    assert "error" not in reference, reference.get("error")
    assert "error" not in result, result.get("error")
    row = parity_cases.CASES[case]
    excused = KERAS_WRONG[case][0] if case in KERAS_WRONG else frozenset()
    differences = parity_cases.compare(reference["keras"], result["trainer"], row, replicas, excused)
    assert differences == []
    if excused:  # the excuse still holds: this Keras gives other values there
        ref_history, history = reference["keras"][0], result["trainer"][0]
        assert any(not parity_cases.close(ref_history[k], history[k]) for k in excused), \
            f"Keras {keras.version()} now gives the trainer's {sorted(excused)}: drop KERAS_WRONG[{case!r}]"
    if row.keras_differs_on_replicas and layout == (2, ""):
        # The row can fail: Keras's own fit under this strategy gives other weights than one device.
        keras_weights, one_device = result["keras_under_strategy"], reference["keras"][1]
        assert not all(parity_cases.close(a, b) for a, b in zip(one_device, keras_weights))


def test_the_table_covers_each_item_of_the_issue():
    # A row per pattern the parity promise names; dropping one should be a decision, not an accident.
    for name in ["train_step_guide_custom_model", "own_steps_no_compiled_loss", "compute_loss_penalty",
                 "test_step_override", "compute_metrics_override", "masking_timedistributed",
                 "embedding_mask_zero_tagger", "per_timestep_sample_weight", "class_weighted_loss", "metric_names",
                 "early_stopping_val_mae", "checkpoint_best_val_accuracy", "custom_loss_and_metric_unregistered",
                 "custom_loss_class_unregistered", "plain_loss_function", "add_loss_mean", "activity_regularizer",
                 "clipnorm", "global_clipnorm", "clipvalue", "gradient_accumulation", "ema_overwrite",
                 "ema_final_weights", "train_step_global_clipnorm", "train_step_gradient_accumulation",
                 "gan_two_optimizers",
                 "padded_seq2seq",
                 # issue 22: every input form and fit argument of model.fit
                 "batched_dataset", "batched_dataset_drop_remainder", "batched_dataset_reshuffled",
                 "batched_dataset_weighted_classes", "generator", "pydataset_workers",
                 "string_inputs", "string_dataset",
                 "class_weight", "class_weight_pydataset", "validation_split", "validation_freq_and_steps",
                 "compile_steps_per_execution", "compile_jit_compile",
                 # issue 51: steps_per_epoch as Keras's epoch iterator counts it
                 "steps_per_epoch_below_the_arrays", "steps_per_epoch_below_a_dataset",
                 "steps_per_epoch_beyond_a_dataset", "steps_per_execution_past_steps_per_epoch",
                 "ragged_token_ids", "sparse_features",
                 # issue 32: the user's own instance, built outside any scope, whatever it is
                 "vae_no_call", "distiller_teacher_in_compute_loss", "custom_objects_with_required_arguments",
                 "lambda_layer", "fitted_twice", "saved_and_reloaded",
                 # issue 34: a dict of columns taken by name, as Keras takes it
                 "dict_inputs_by_key", "dict_inputs_more_columns", "list_inputs_columns_by_name",
                 "train_step_returns_loss_tensors",
                 # issue 39: random layers, BatchNormalization, a loss computed in the forward pass
                 *RANDOM, "endpoint_layer_loss", "embedding_mask_zero_xla",
                 # a variable a layer updates from its batch, summed over replicas
                 "examples_seen_summed"]:
        assert name in parity_cases.CASES
    forms = {case.form for case in parity_cases.CASES.values()}
    assert forms == {"arrays", *parity_cases.FORMS}, forms


def test_docs_testing_md_counts_the_rows():
    # The count a reader sees in docs/testing.md's tier table (it once said 79 of 75).
    assert f"{len(ALL)} rows against `model.fit`" in (TESTS.parent / "docs" / "testing.md").read_text()
