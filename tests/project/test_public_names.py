"""The names a user writes keep working wherever the modules behind them live: `from trainer import ...`,
`trainer.callbacks`, `trainer.quiet`, the `trainer-launch` command and `python -m trainer.launch`; and
setup.cfg installs every folder of the package, so that a wheel holds what an editable install finds."""

import configparser
import json
import subprocess
import sys
from pathlib import Path

from conftest import run_code, script_failed

ROOT = Path(__file__).parent.parent.parent

_NAMES = """
import inspect, json, sys
import trainer
from trainer import Trainer, resolve_strategy, notebook_launcher, cluster_info, ClusterInfo, ScaledSchedule
from trainer.callbacks import (BackupAndRestore, ChiefOnly, CSVLogger, JSONLogger, ModelCheckpoint, NanGuard,
                               PlotHistory, ProgressBar, TensorBoard)
from trainer.quiet import startup_notices_hidden
kinds = {name: "class" if inspect.isclass(getattr(trainer, name)) else type(getattr(trainer, name)).__name__
         for name in trainer.__all__}
print(json.dumps({"kinds": kinds, "in_dir": sorted(set(trainer.__all__) - set(dir(trainer))),
                  "callbacks": [c.__module__.split(".")[:2] for c in (BackupAndRestore, ChiefOnly, TensorBoard)]}))
"""


def test_the_public_names_import_as_the_readme_writes_them():
    proc = run_code(_NAMES, cwd=ROOT)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["kinds"]["Trainer"] == "class" and got["kinds"]["ClusterInfo"] == "class"
    assert got["kinds"]["resolve_strategy"] == got["kinds"]["notebook_launcher"] == "function"
    assert got["kinds"]["STRATEGY_NAMES"] in ("tuple", "frozenset", "list")
    assert len(got["kinds"]) >= 12 and not got["in_dir"], got
    assert got["callbacks"] == [["trainer", "callbacks"]] * 3


def test_the_launcher_and_trainer_quiet_start_without_tensorflow():
    proc = run_code("import sys, trainer, trainer.quiet, trainer.launch.launcher, trainer.launch.notebook\n"
                    "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))", cwd=ROOT)
    assert proc.stdout.strip() == "[]"


def test_the_trainer_launch_command_and_the_module_run_the_launcher():
    command = Path(sys.executable).parent / "trainer-launch"
    assert command.exists(), f"{command} is missing: install the package (`pip install -e .`), which makes it"
    for argv in ([str(command), "--help"], [sys.executable, "-m", "trainer.launch", "--help"]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, script_failed(proc)
        assert proc.stdout.startswith("usage: trainer-launch") and "--workers" in proc.stdout, proc.stdout[:500]
    proc = subprocess.run([str(command), "--workers", "0", "train.py"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--workers" in proc.stderr, script_failed(proc)


def test_setup_cfg_installs_every_folder_of_the_package():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    folders = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "trainer").rglob("__init__.py")}
    assert listed == folders | {"trainer.callbacks"}, f"setup.cfg: {sorted(listed)}; folders: {sorted(folders)}"
    assert config["options"]["package_dir"].split() == ["trainer.callbacks", "=", "callbacks"]


def _distribution(site: Path, name: str, version: str, record: list[str]) -> None:
    """A distribution's metadata as pip leaves it in `site` (its files need not be there)."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{path},,\n" for path in record))


def test_beside_the_registrys_trainer_the_import_refuses_and_says_how_to_part_them(tmp_path):
    """Coqui's `trainer` (the registry's name) installs a `trainer` package too: pip writes one over the
    other. An editable install of a distribution once named `trainer` (this one's old name) installs no copy,
    nor does a package that only nests a folder of that name."""
    coqui, editable = tmp_path / "coqui", tmp_path / "editable"
    _distribution(coqui, "trainer", "0.0.36", ["trainer/__init__.py", "trainer/trainer.py", "trainer/torch.py"])
    _distribution(editable, "trainer", "0.1.0", ["__editable__.trainer-0.1.0.pth", "vendor/trainer/__init__.py"])
    for site, refused in ((coqui, True), (editable, False)):
        proc = run_code("import trainer", timeout=120, cwd=tmp_path, env={"PYTHONPATH": str(site)}, check=False)
        assert (proc.returncode != 0) == refused, proc.stderr[-2000:]
        if refused:
            assert "ImportError: Another distribution named `trainer` (version 0.0.36" in proc.stderr
            assert "pip uninstall -y trainer keras-strategy-trainer" in proc.stderr


def test_the_distribution_is_named_apart_from_the_registrys_trainer():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    import trainer

    assert config["metadata"]["name"] == trainer.DISTRIBUTION == "keras-strategy-trainer"
