"""The two commands of the README's first screen (`make example`, `make test`) and the set-up they share.

The set-up steps (.ci/setup.sh) run here against stand-ins for apt-get, sudo and pip, so that every
branch is taken on any machine: present, installed, skipped without apt or without root, retried after
reading the package lists, and pip run only when setup.cfg changed.
"""

import re
import shutil
import subprocess

import pytest

from conftest import TESTS

ROOT = TESTS.parent
SETUP = ROOT / ".ci" / "setup.sh"
README = (ROOT / "README.md").read_text()


def _bash(script: str, cwd, path_dirs=(), env=None) -> subprocess.CompletedProcess:
    path = ":".join([*map(str, path_dirs), "/usr/bin", "/bin"])
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {SETUP}; {script}"], cwd=cwd,
                          capture_output=True, text=True, timeout=60, env={"PATH": path, **(env or {})})


def _stand_in(folder, name: str, body: str) -> None:
    """An executable `name` in `folder` that appends its arguments to calls.log, then runs `body`."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / name
    script.write_text(f'#!/bin/bash\necho "{name} $*" >> "{folder}/calls.log"\n{body}\n')
    script.chmod(0o755)


def _calls(folder) -> list[str]:
    log = folder / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


DEBIAN = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not Debian or Ubuntu: no dpkg-query")


@DEBIAN
def test_a_package_already_installed_is_left_alone(tmp_path):
    proc = _bash('debian_packages "the shell" bash', tmp_path)
    assert proc.returncode == 0 and proc.stdout == "[setup] present: bash (the shell)\n", proc.stderr


@DEBIAN
def test_without_apt_a_missing_package_is_skipped_and_the_cost_said(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("dpkg-query", "grep", "id"):  # a PATH with no apt-get
        (bin_ / tool).symlink_to(shutil.which(tool))
    script = f"source {SETUP}; debian_packages 'the Slurm tests skip' no-such-pkg"
    proc = subprocess.run([shutil.which("bash"), "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[setup] skipped: no-such-pkg, no apt-get here (the Slurm tests skip)\n"


def test_as_root_apt_installs_and_reads_the_package_lists_once_when_it_must(tmp_path):
    bin_ = tmp_path / "bin"
    # The first install fails as on a fresh machine with no package lists; after `update` it works.
    _stand_in(bin_, "apt-get", f'[ "$1" = install ] && ! grep -q "^apt-get update" "{bin_}/calls.log" && exit 100; '
                               "exit 0")
    _stand_in(bin_, "id", "echo 0")
    proc = _bash('debian_packages "the data" no-such-pkg', tmp_path, [bin_])
    assert proc.returncode == 0, proc.stderr
    assert _calls(bin_)[1:] == ["apt-get install -y --no-install-recommends no-such-pkg", "apt-get update -q",
                                "apt-get install -y --no-install-recommends no-such-pkg"]
    assert "[setup] apt-get install no-such-pkg (the data)" in proc.stdout and "skipped" not in proc.stdout


@pytest.mark.parametrize("sudo_works", [True, False], ids=["sudo", "no-sudo"])
def test_a_user_installs_with_sudo_or_is_told_the_command(tmp_path, sudo_works):
    bin_ = tmp_path / "bin"
    _stand_in(bin_, "id", "echo 1000")
    _stand_in(bin_, "sudo", '[ "$1" = -n ] && [ "$2" = true ] && exit ' + ("0" if sudo_works else "1") + '; "$@"')
    _stand_in(bin_, "apt-get", "exit 0")
    proc = _bash('debian_packages "the data" no-such-pkg', tmp_path, [bin_])
    assert proc.returncode == 0, proc.stderr
    installs = [c for c in _calls(bin_) if c.startswith("apt-get install")]
    if sudo_works:
        assert "sudo apt-get install -y --no-install-recommends no-such-pkg" in _calls(bin_)
        assert installs == ["apt-get install -y --no-install-recommends no-such-pkg"]
    else:
        assert installs == []
        assert ("[setup] skipped: no-such-pkg, which needs root or sudo (the data): sudo apt-get install "
                "no-such-pkg") in proc.stdout


def test_pip_runs_again_only_when_setup_cfg_changes(tmp_path):
    shutil.copy(ROOT / "setup.cfg", tmp_path / "setup.cfg")
    venv_bin = tmp_path / ".venv" / "bin"
    _stand_in(venv_bin, "python", "exit 0")
    _stand_in(venv_bin, "pip", "exit 0")
    for _ in range(2):
        proc = _bash("python_env test,ecosystem", tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert [c for c in _calls(venv_bin) if c.startswith("pip")] == ['pip install -q -e .[test,ecosystem]']
    assert "present: .venv with .[test,ecosystem] (setup.cfg unchanged" in proc.stdout
    with open(tmp_path / "setup.cfg", "a") as f:
        f.write("\n# a new dependency\n")
    assert _bash("python_env test,ecosystem", tmp_path).returncode == 0
    assert len([c for c in _calls(venv_bin) if c.startswith("pip")]) == 2


def test_the_first_screen_gives_the_two_commands_and_ci_runs_the_test_one():
    first_screen = "\n".join(README.splitlines()[:40])
    assert "make example" in first_screen and "make test" in first_screen
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^example:\n\t@bash \.ci/example \$\(ARGS\)$", makefile, re.M)
    assert re.search(r"^test:\n\t@bash \.ci/test$", makefile, re.M)
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.M)


def test_make_test_does_what_the_readme_does_by_hand():
    by_hand = re.search(r"## Set up by hand.*?```bash\n(.*?)```", README, re.S).group(1).strip().splitlines()
    assert len(by_hand) == 4  # the real data and Slurm (apt, optional), the venv, the lint and tests
    test = (ROOT / ".ci" / "test").read_text()
    for line in by_hand[:2]:  # the same Debian packages
        packages = re.search(r"apt-get install -y (?:--no-install-recommends )?([\w -]+?) \|\|", line).group(1)
        assert re.search(r"debian_packages .*\\\n\s+" + re.escape(packages) + "$", test, re.M), packages
    extras = re.search(r"^python_env (\S+)$", test, re.M).group(1)  # the same extras (test,ecosystem,docs)
    assert f'-e ".[{extras}]"' in by_hand[2], extras
    for command in by_hand[3].split(" && "):
        assert re.search("^" + re.escape(command) + "$", test, re.M), command
    assert test.rstrip().endswith("bash .ci/oldest\nbash .ci/next")
