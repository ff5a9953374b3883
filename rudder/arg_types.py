"""argparse types shared by the CLIs: a bad value is argparse's one usage line naming it."""

from __future__ import annotations

import argparse


def positive(kind: type):
    """A number above 0 of `kind` (int or float): threads, seconds, a row or window count."""
    def parse(value: str):
        try:
            x = kind(value)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None
        if not x > 0:
            raise argparse.ArgumentTypeError(f"{value}: must be above 0")
        return x

    return parse
