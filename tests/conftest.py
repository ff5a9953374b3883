"""Suite-wide rule: the suite cannot pass by skipping what CI exists to run.

CI runs as root, where network namespaces, emulated clusters and the test Slurm cluster all
work; there a skipped `slow` or `netns` test means a feature went untested (Slurm not
installed, a namespace that could not be made, a probe that failed), so the skip is turned
into a failure that says so. A developer without root still gets the skips. A test that may
skip even in CI (e.g. it needs a GPU) says so with `@pytest.mark.optional`.
"""
from __future__ import annotations

import os

import pytest

STRICT = os.geteuid() == 0


def strict_skip_failure(item, report) -> str | None:
    """The failure message for a skip that must not happen here, or None."""
    if not (STRICT and report.skipped) or hasattr(report, "wasxfail"):
        return None
    if item.get_closest_marker("optional") is not None:
        return None
    if item.get_closest_marker("slow") is None and item.get_closest_marker("netns") is None:
        return None
    why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return (f"{item.nodeid} was skipped although running as root, where every cluster, "
            f"network-namespace and Slurm test must run ({why}). Fix the environment "
            "(e.g. scripts/install_slurm.sh) or mark the test optional.")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    msg = strict_skip_failure(item, report)
    if msg is not None:
        report.outcome = "failed"
        report.longrepr = msg
