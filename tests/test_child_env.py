"""Child processes (DGL servers and trainers, Parsl's helpers and workers) run this venv and this
copy of the package, even where another copy comes earlier on PYTHONPATH (rudder/child_env.py)."""

import os
import subprocess
import sys
from pathlib import Path

from rudder.child_env import PKG_ROOT, first_on, with_this_rudder


def test_first_on_puts_the_entry_first_once():
    sep = os.pathsep
    assert first_on(f"a{sep}r{sep}{sep}b{sep}r", "r") == f"r{sep}a{sep}b"
    assert first_on("", "r") == "r"
    assert first_on(None, "r") == "r"


def _imported_from(env: dict[str, str]) -> str:
    code = "import rudder, pathlib; print(pathlib.Path(rudder.__file__).resolve().parents[1])"
    return subprocess.run([sys.executable, "-c", code], env=env, cwd="/", capture_output=True,
                          text=True, check=True, timeout=60).stdout.strip()


def test_a_child_imports_this_copy_before_another_one_on_pythonpath(tmp_path):
    other = tmp_path / "other"
    (other / "rudder").mkdir(parents=True)
    (other / "rudder" / "__init__.py").write_text("")
    for pythonpath in [str(other), os.pathsep.join([str(other), PKG_ROOT])]:
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": pythonpath}
        assert _imported_from(env) == str(other)  # the other copy wins as things stand
        child = with_this_rudder(env)
        assert _imported_from(child) == str(Path(PKG_ROOT).resolve())
        assert child["PYTHONPATH"].split(os.pathsep) == [PKG_ROOT, str(other)]
        assert child["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)


def test_the_workflow_prepares_its_own_environment_the_same_way(tmp_path, monkeypatch):
    from rudder.workflow.execution import prepare_environment

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), PKG_ROOT]))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    prepare_environment()
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [PKG_ROOT, str(tmp_path)]
    assert os.environ["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
