"""Numbers and lists on the command line are checked where argparse reads them: a bad value is
one usage line naming the option and the value (exit 2), before any file is read or written."""
from __future__ import annotations

import argparse

import pytest

from rudder.arg_types import at_least, positive, ranks
from rudder.cli import main


def test_positive_at_least_and_ranks_parse_and_refuse():
    assert positive(int)("3") == 3 and positive(float)("0.5") == 0.5
    assert at_least(float, 0)("0") == 0.0 and at_least(int, 2)("2") == 2
    assert ranks("0") == [0] and ranks("0, 2") == [0, 2]
    for parse, value, why in [(positive(int), "0", "above 0"), (positive(int), "2.5", "whole number"),
                              (positive(float), "nan", "finite"), (positive(float), "inf", "finite"),
                              (positive(float), "-1", "above 0"), (at_least(int, 2), "1", "at least 2"),
                              (at_least(float, 0), "-5", "at least 0"), (ranks, "x", "whole numbers"),
                              (ranks, "0,-1", "whole numbers"), (ranks, "0,", "whole numbers")]:
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            parse(value)


@pytest.mark.parametrize("argv, option", [
    (["sim", "NOWHERE.npz", "--ranks", "x"], "--ranks"),
    (["sim", "NOWHERE.npz", "--fraction", "nan"], "--fraction"),
    (["sim", "NOWHERE.npz", "--fraction", "-1"], "--fraction"),
    (["sim", "NOWHERE.npz", "--threads", "0"], "--threads"),
    (["tracegen", "--fraction", "inf"], "--fraction"),
    (["collect", "NOWHERE", "--lock-timeout", "-5"], "--lock-timeout"),
    (["classifiers", "train", "--runs", "NOWHERE", "--folds", "1"], "--folds"),
])
def test_the_clis_refuse_bad_numbers_by_name(capsys, argv, option):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {option}: {argv[-1]}" in err.replace("'", ""), err
    assert "NOWHERE" not in err  # refused before the path was looked at
