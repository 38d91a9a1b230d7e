"""The tested range lives in one place, `trainer/_compat/version.py` (`TESTED`, `OLDEST`): setup.cfg's
requirements, the CI tiers' pins and Pythons, and docs/reference.md's version matrix are held to it, so that a
release day changes it there and each of these fails until it follows (docs/contributors/release_day.md)."""

import re
from pathlib import Path

from trainer._compat import version

ROOT = Path(__file__).parent.parent.parent
SETUP = (ROOT / "setup.cfg").read_text()
CI = ROOT / ".ci"


def _option(name: str) -> str:
    start = SETUP.index(f"\n{name} =")
    end = re.compile(r"\n\S").search(SETUP, start + 1)
    return SETUP[start:end.start() if end else None]


def _pins(text: str) -> dict[str, str]:
    return dict(re.findall(r"\b(tensorflow|keras|keras-nightly)==([\w.]+)", text))


def _major_minor(text: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", text).groups()
    return int(major), int(minor)


def _matrix() -> dict[str, tuple[str, ...]]:
    page = (ROOT / "docs" / "reference.md").read_text()
    section = page[page.index("## Versions\n"):]
    rows = re.findall(r"^\| (next|newest|oldest) \| ([\w.]+) \| ([\w.]+) \| ([\d.]+) \|", section, re.M)
    return {row[0]: row[1:] for row in rows}


def test_setup_cfg_requires_the_tested_tensorflow_and_takes_keras_through_it():
    requires = _option("install_requires")
    assert re.findall(r"^\s+(tensorflow\S*)$", requires, re.M) == [version.requirement("TensorFlow")], requires
    # keras or keras-nightly comes with TensorFlow; naming `keras` would install it beside keras-nightly
    assert not re.search(r"^\s+keras", requires, re.M), requires
    assert version.requirement("TensorFlow") == "tensorflow>=2.18.1,<2.23"  # the function's own arithmetic


def test_python_requires_is_what_the_tiers_run():
    low, high = re.search(r"^python_requires = >=3\.(\d+),<3\.(\d+)$", SETUP, re.M).groups()
    tiers = _matrix()
    pythons = {_major_minor(python) for _, _, python in tiers.values()}
    assert min(pythons) == (3, int(low)), (low, tiers)
    # The newest Python allowed (the one below the ceiling) is the one tested by hand (the page says which).
    page = (ROOT / "docs" / "reference.md").read_text()
    assert f"Python 3.{int(high) - 1} by hand" in page
    classifiers = set(re.findall(r"Programming Language :: Python :: (3\.\d+)", SETUP))
    assert classifiers == {f"3.{minor}" for minor in range(int(low), int(high))}, classifiers
    assert "python_of 3.12" in (CI / "next").read_text() and tiers["next"][2] == "3.12"


def test_the_tiers_pin_the_ends_of_the_tested_range():
    oldest, following = _pins((CI / "oldest").read_text()), _pins((CI / "next-pins.txt").read_text())
    assert oldest == {"tensorflow": version.OLDEST["TensorFlow"], "keras": version.OLDEST["Keras"]}, oldest
    assert _major_minor(following["tensorflow"]) == version.TESTED["TensorFlow"][1], following
    keras = following.get("keras-nightly", following.get("keras"))
    assert _major_minor(keras) == version.TESTED["Keras"][1], following
    for name in ("Keras", "TensorFlow"):
        assert _major_minor(version.OLDEST[name]) == version.TESTED[name][0], name


def test_the_pages_matrix_is_the_tiers():
    tiers = _matrix()
    following = _pins((CI / "next-pins.txt").read_text())
    assert tiers["oldest"][:2] == (version.OLDEST["TensorFlow"], version.OLDEST["Keras"]), tiers
    assert tiers["next"][:2] == (following["tensorflow"], following.get("keras-nightly", following.get("keras")))
    newest = tuple(_major_minor(text) for text in tiers["newest"][:2])
    for (name, (low, high)), tested in zip((("TensorFlow", version.TESTED["TensorFlow"]),
                                            ("Keras", version.TESTED["Keras"])), newest):
        assert low <= tested <= high, (name, tested)
    page = (ROOT / "docs" / "reference.md").read_text()
    assert f"`{version.requirement('TensorFlow')}`" in page
