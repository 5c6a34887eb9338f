"""Segment-aware training sampling: chunks of consecutive frames inside an episode, a segment, or across a
segment boundary — offline over an exported LeRobot dataset, online over a live staging store.

One import path for all of it; the parts live in their own modules:

- ``storage/sampling/window_index.py``: what a window is (modes, weighting) and the index that draws them;
- ``storage/sampling/offline.py``: :class:`SegmentWindowSampler`, a ``torch.utils.data.Sampler[int]``;
- ``storage/sampling/online.py``: :class:`OnlineWindowSampler`, tailing a store while a job writes it.

``SegmentWindowSampler`` is loaded on first use, so importing this module (or the online sampler) does
not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from demoforge.storage.sampling.online import OnlineWindowSampler, Window
from demoforge.storage.sampling.window_index import (
    MODES,
    WEIGHTINGS,
    NoEligibleWindowError,
    WindowIndex,
    chunk_delta_timestamps,
    segments_from_frames,
    window_is_eligible,
)

if TYPE_CHECKING:
    from demoforge.storage.sampling.offline import SegmentWindowSampler

__all__ = ["MODES", "WEIGHTINGS", "NoEligibleWindowError", "OnlineWindowSampler", "SegmentWindowSampler", "Window",
           "WindowIndex", "chunk_delta_timestamps", "segments_from_frames", "window_is_eligible"]


def __getattr__(name: str) -> Any:
    if name == "SegmentWindowSampler":
        from demoforge.storage.sampling.offline import SegmentWindowSampler

        return SegmentWindowSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
