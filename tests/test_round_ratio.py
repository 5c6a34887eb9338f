"""The benchmarks' verdict on a ratio target (tools/round_ratio.py): what docs/performance.md's "met", "not
met" and "cannot tell" rest on."""

from __future__ import annotations

import sys

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "tools"))

from round_ratio import median_interval, round_ratio  # noqa: E402


def test_the_median_interval_has_the_binomial_coverage_of_its_order_statistics() -> None:
    # n = 5: only [min, max] reaches 90 % (1 - 2/32); n = 8: [x2, x7] (1 - 2 * 9/256), not [x3, x6] (0.711).
    assert median_interval([5, 1, 4, 2, 3]) == (1, 5, 1 - 2 / 32)
    assert median_interval(range(8)) == (1, 6, 1 - 2 * 9 / 256)
    # Too few rounds for 90 %: the widest interval and its (lower) coverage, said as it is.
    assert median_interval([1.1, 1.0, 1.2]) == (1.0, 1.2, 0.75)
    with pytest.raises(ValueError, match="no rounds"):
        median_interval([])


def test_each_round_is_divided_by_its_own_baseline_and_the_verdict_needs_the_whole_interval() -> None:
    # A machine twice as slow in round 2 moves both sides: the ratios stay 1.02-1.04.
    ratio = round_ratio([10.2, 20.8, 10.3, 10.4, 10.3], [10, 20, 10, 10, 10])
    assert ratio.ratios == pytest.approx((1.02, 1.04, 1.03, 1.04, 1.03))
    assert ratio.median == pytest.approx(1.03) and (ratio.low, ratio.high) == pytest.approx((1.02, 1.04))
    assert ratio.verdict(1.05) == "met"
    assert ratio.verdict(1.01) == "not met"
    assert ratio.verdict(1.03) == "cannot tell from 5 round(s)"
    assert "target <= 1.05: met" in ratio.describe(1.05) and "rounds 1.020, 1.040" in ratio.describe()


def test_rounds_that_do_not_pair_are_refused() -> None:
    with pytest.raises(ValueError, match="2 candidate round"):
        round_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        round_ratio([1.0], [0.0])
