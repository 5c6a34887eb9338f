"""Episode numbers as people type them: ``3,7,10-12`` or ``0-9,12,40-`` (inclusive ranges, an open end).

One parser for every command that takes such a list (``replay --episodes``, ``edit --delete``), so they
accept and refuse the same things.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_RANGE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d*)\s*)?")


class EpisodeSpecError(ValueError):
    """A list of episode numbers that does not parse (the message quotes the option and the bad item)."""


@dataclass(frozen=True)
class EpisodeRange:
    low: int
    high: int | None  # inclusive; None: open to the end

    def __contains__(self, number: object) -> bool:
        return isinstance(number, int) and self.low <= number and (self.high is None or number <= self.high)


def parse_episode_ranges(spec: str, option: str = "--episodes") -> tuple[EpisodeRange, ...]:
    """``"0-9,12,20-"`` as ranges; refuses anything else (an empty item, a reversed range, a sign, a word)."""
    parts: list[EpisodeRange] = []
    for item in spec.split(","):
        match = _RANGE.fullmatch(item)
        if not match:
            raise EpisodeSpecError(f"{option} {spec!r}: {item.strip()!r} is not N, N-M or N- (e.g. 0-9,12,20-)")
        low = int(match.group(1))
        high = low if match.group(2) is None else (int(match.group(2)) if match.group(2) else None)
        if high is not None and high < low:
            raise EpisodeSpecError(f"{option} {spec!r}: the range {item.strip()!r} is empty")
        parts.append(EpisodeRange(low, high))
    return tuple(parts)


def resolve_episode_ranges(ranges: Sequence[EpisodeRange], available: Sequence[int], spec: str,
                           option: str) -> list[int]:
    """The numbers ``ranges`` name, each of which must be in ``available`` (sorted, e.g. 0..N-1): a number or
    an open range that names no episode is an error that says which episodes there are."""
    present = set(available)
    chosen: set[int] = set()
    unknown: list[str] = []
    for part in ranges:
        if part.high is None:
            named = [n for n in available if n >= part.low]
            if not named:
                unknown.append(f"{part.low}-")
        else:
            named = list(range(part.low, part.high + 1))
            unknown += [str(n) for n in named if n not in present]
        chosen.update(n for n in named if n in present)
    if unknown:
        shown = ", ".join(unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        raise EpisodeSpecError(f"{option} {spec!r}: no episode {shown} in the dataset (it holds "
                               f"{describe_numbers(available)})")
    return sorted(chosen)


def describe_numbers(numbers: Sequence[int]) -> str:
    """``episodes 0-9`` / ``episodes 0-3, 5, 7-9`` / ``no episodes``: a sorted list as ranges."""
    if not numbers:
        return "no episodes"
    runs: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return "episodes " + ", ".join(runs)
