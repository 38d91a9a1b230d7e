"""The user's arrays: read where they lie, and never written.

Arrays mapped from a file (np.memmap) are read by rows where the steps need them (bench/input_bytes.py
measures each worker's share); their numbers are held against `model.fit` on one device, on 2 replicas with
an uneven last batch, through the in-step gather of CPU replicas and the pipeline GPUs and TPUs read through
(TRAINER_ACCELERATOR_READER=1). The arrays a PyDataset yields slices of stay as they were.
"""

import numpy as np
import pytest

from conftest import mirrored, run_python, SCRIPTS, tiny_data, tiny_model
from trainer import Trainer
from trainer.data import arrays as arrays_lib
from trainer.data import boundary
from trainer.data import readers


@pytest.fixture(params=["float32", "float64"])
def mapped(tmp_path, request):
    """x and w mapped from files; float64 ones are fed as float32, as model.fit feeds float64 arrays."""
    x, y, w = tiny_data(100)
    files = []
    for name, array in (("x", x), ("w", w)):
        array.astype(request.param).tofile(tmp_path / name)
        files.append(np.memmap(tmp_path / name, dtype=request.param, mode="r", shape=array.shape))
    return files[0], y, files[1]


def test_a_memmap_and_its_views_are_mapped_and_an_array_in_memory_is_not(mapped):
    x = mapped[0]
    assert arrays_lib.is_mapped(x) and arrays_lib.is_mapped(np.asarray(x)) and arrays_lib.is_mapped(x[10:20])
    assert not arrays_lib.is_mapped(np.array(x)) and not arrays_lib.is_mapped(x[[1, 2]])


@pytest.mark.parametrize("reader", ["in step", "accelerator"])
def test_a_memmap_trains_to_model_fits_numbers_on_two_replicas(mapped, reader, monkeypatch):
    x, y, w = mapped
    if reader == "accelerator":
        monkeypatch.setenv(readers.ACCELERATOR_READER, "1")
    reference = tiny_model(optimizer="adam", lr=0.01)
    expected = reference.fit(np.array(x), y, sample_weight=np.array(w), batch_size=32, epochs=2, shuffle=False,
                             verbose=0)
    model = tiny_model(optimizer="adam", lr=0.01)
    trainer = Trainer(strategy=mirrored(2), verbose=0)
    history = trainer.fit(model, x, y, sample_weight=w, batch_size=32, epochs=2, shuffle=False)
    assert sorted(history.history) == sorted(expected.history)
    for key, values in expected.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-5, err_msg=key)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.evaluate(model, x, y, sample_weight=w, batch_size=32),
                               reference.evaluate(np.array(x), y, sample_weight=np.array(w), batch_size=32, verbose=0),
                               rtol=1e-5)
    np.testing.assert_allclose(trainer.predict(model, x, batch_size=32),
                               reference.predict(np.array(x), batch_size=32, verbose=0), rtol=1e-5, atol=1e-6)


def test_a_float64_memmap_stays_mapped_until_its_rows_are_taken(mapped):
    """Converted whole, it would be read whole on every worker; its rows are cast as they are taken."""
    x, y, w = mapped
    inp = boundary.as_input(x, y, w, arg="x")
    assert all(arrays_lib.is_mapped(a) for a in (inp.arrays[0], inp.arrays[2]))
    taken = arrays_lib.take(inp.arrays[0], np.array([3, 1]))
    assert taken.dtype == np.float32 and not arrays_lib.is_mapped(taken)
    np.testing.assert_array_equal(taken, np.asarray(x[[3, 1]], np.float32))



@pytest.mark.slow
def test_the_arrays_a_pydataset_yields_views_of_stay_as_they_were():
    """tf.data may make tensors that share a yielded array's memory, and a step that computed in place on a
    replica's share of such a batch wrote into the user's arrays: in 2 processes of 3 (tests/scripts/user_memory_run.py,
    2 CPU replicas), over 1,000 values of `y` were overwritten in the first fit, and its second epoch trained on
    them. Three processes, so that the race shows in one of them without the copy (the chance that it shows in
    none is under 5 percent)."""
    for _ in range(3):
        result = run_python(SCRIPTS / "user_memory_run.py", "2")
        assert result["values_changed"] == [0, 0]
