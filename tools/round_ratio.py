"""Judge a ratio target from interleaved rounds: the median of the per-round ratios and an interval for it.

One round runs the baseline (env only) and the candidate (generate) back to back; the machine's speed moves
between rounds (the same env-only job has taken 19.4-23.8 s of wall and 31.7-38.6 s of CPU on one quiet
afternoon), so each round's candidate is divided by its own baseline, and the rounds' ratios are summarized.

The interval is the distribution-free one for a median, from order statistics: with the ratios sorted,
[r_k, r_(n+1-k)] holds the median of the machine's ratio distribution with probability
1 - 2 P(Binomial(n, 1/2) <= k - 1), whatever that distribution's shape (rounds taken as independent). It is
written here (a binomial sum) rather than taken from scipy because a bootstrap of 3-8 rounds is no better and
the exact coverage is what the verdict needs to print. The verdict against ``target`` (lower is better):
``met`` when the whole interval is at or under it, ``not met`` when the whole interval is over it, otherwise
``cannot tell`` from that many rounds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: The coverage the interval aims for; with fewer rounds than that needs (n <= 4), the widest one is used.
CONFIDENCE = 0.90


@dataclass(frozen=True)
class RoundRatio:
    """Per-round ratios of a candidate over its baseline, their median, and an interval for the median."""

    ratios: tuple[float, ...]
    median: float
    low: float
    high: float
    coverage: float

    def verdict(self, target: float) -> str:
        if self.high <= target:
            return "met"
        if self.low > target:
            return "not met"
        return f"cannot tell from {len(self.ratios)} round(s)"

    def describe(self, target: float | None = None) -> str:
        """One line: the median, the interval with its coverage, every round's ratio, and the verdict."""
        rounds = ", ".join(f"{r:.3f}" for r in self.ratios)
        line = (f"median {self.median:.3f}, {self.coverage:.0%} interval [{self.low:.3f}, {self.high:.3f}] "
                f"(rounds {rounds})")
        return line if target is None else f"{line}; target <= {target:g}: {self.verdict(target)}"


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """The narrowest order-statistic interval for the median with at least ``confidence`` coverage (the
    widest, [min, max], when too few values reach it), and its exact coverage."""
    if not values:
        raise ValueError("no rounds to summarize")
    ordered = sorted(values)
    n = len(ordered)

    def coverage(k: int) -> float:  # of [x_k, x_(n+1-k)], k counted from 1
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return ordered[k - 1], ordered[n - k], coverage(k)


def round_ratio(candidate: Sequence[float], baseline: Sequence[float],
                confidence: float = CONFIDENCE) -> RoundRatio:
    """Summarize ``candidate[i] / baseline[i]`` over rounds ``i`` (the two lists in round order)."""
    if len(candidate) != len(baseline):
        raise ValueError(f"{len(candidate)} candidate round(s) against {len(baseline)} baseline round(s)")
    if any(b <= 0 for b in baseline):
        raise ValueError(f"baseline times must be positive, got {list(baseline)}")
    ratios = tuple(c / b for c, b in zip(candidate, baseline))
    low, high, cover = median_interval(ratios, confidence)
    return RoundRatio(ratios, statistics.median(ratios), low, high, cover)
