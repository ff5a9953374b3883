"""The import contract (.importlinter, import-linter): DESIGN.md's layers hold, and a new cycle
or upward import breaks the suite."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import importlinter  # noqa: F401  (pinned in requirements.txt: missing, the suite fails rather than skips)

ROOT = Path(__file__).resolve().parents[1]


def lint(root: Path) -> subprocess.CompletedProcess:
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_contract_is_kept():
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_an_upward_import_breaks_it(tmp_path):
    """config importing the policy registry again (the old config <-> prefetch cycle) fails."""
    for name in ("rudder", "apps", "workflows"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.jsonl"))
    shutil.copy(ROOT / ".importlinter", tmp_path)
    cfg = tmp_path / "rudder" / "config.py"
    cfg.write_text(cfg.read_text() + "\n\ndef _registry():\n    from rudder.prefetch.policies import REGISTRY\n\n"
                   "    return REGISTRY\n")
    r = lint(tmp_path)
    assert r.returncode != 0
    assert "BROKEN" in r.stdout and "rudder.config -> rudder.prefetch.policies" in r.stdout
