"""The suite's own rules: as root a skipped slow/netns test fails (tests/conftest.py), and no
test skips on an import of the project's own code."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent

SAMPLE = '''
import pytest

@pytest.mark.slow
@pytest.mark.skipif(True, reason="slurm-wlm missing")
def test_cluster():
    pass

@pytest.mark.netns
def test_ns():
    pytest.skip("no namespaces")

@pytest.mark.slow
@pytest.mark.optional
def test_gpu():
    pytest.skip("no GPU")

def test_fast():
    pytest.skip("fast tests may skip")
'''


def test_skipped_cluster_tests_fail_as_root(tmp_path):
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  slow: s\n  netns: n\n  optional: o\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                          str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    if os.geteuid() == 0:
        assert out.returncode == 1, text
        # a skipif skips at setup, so pytest reports that one as an error: both fail the run
        assert re.search(r"1 failed, 2 skipped, 1 error", text), text
        assert "test_cluster was skipped although running as root" in text
        assert "slurm-wlm missing" in text and "no namespaces" in text
    else:
        assert out.returncode == 0 and re.search(r"4 skipped", text), text


def test_no_test_skips_on_the_project_s_own_imports():
    for f in TESTS.glob("test_*.py"):
        for m in re.finditer(r"importorskip\(\s*['\"]([\w.]+)", f.read_text()):
            assert not m.group(1).startswith("rudder"), f"{f.name}: importorskip({m.group(1)!r})"
