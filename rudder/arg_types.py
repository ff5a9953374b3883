"""argparse types shared by the CLIs: a bad value is argparse's one usage line naming it."""

from __future__ import annotations

import argparse
import math


def _number(kind: type, value: str):
    try:
        x = kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None
    if not math.isfinite(x):  # nan and inf pass no bound honestly
        raise argparse.ArgumentTypeError(f"{value}: must be a finite number")
    return x


def positive(kind: type):
    """A number above 0 of `kind` (int or float): threads, seconds, a row or window count."""
    def parse(value: str):
        x = _number(kind, value)
        if not x > 0:
            raise argparse.ArgumentTypeError(f"{value}: must be above 0")
        return x

    return parse


def at_least(kind: type, low):
    """A number of `kind` no less than `low`: a timeout that may be 0, two or more folds."""
    def parse(value: str):
        x = _number(kind, value)
        if x < low:
            raise argparse.ArgumentTypeError(f"{value}: must be at least {low}")
        return x

    return parse


def ranks(value: str) -> list[int]:
    """A comma list of trainer ranks (whole numbers from 0): '0', '0,2'."""
    out = []
    for part in value.split(","):
        part = part.strip()
        if not part.isdigit():
            raise argparse.ArgumentTypeError(
                f"{value!r}: give ranks as whole numbers from 0, separated by commas (e.g. 0,1)")
        out.append(int(part))
    return out
