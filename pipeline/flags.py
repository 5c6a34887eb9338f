"""The command line's words for what the stages report: they raise typed errors and return reasons that carry
the facts (stages/control.py ``ControlError``, stages/plan.py ``RunawayStop``); these functions word them with
the flags a user of ``demoforge`` types."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from demoforge.stages.control import ControlError, ControlOption

if TYPE_CHECKING:  # the CLI's start imports no planner
    from demoforge.stages.plan import RunawayStop

CONTROL_FLAGS: Mapping[ControlOption, str] = {
    ControlOption.NOISE: "--noise",
    ControlOption.DRIVER: "--driver",
    ControlOption.BETA: "--beta",
    ControlOption.TAKEOVER: "--takeover",
    ControlOption.POLICY_TIMEOUT: "--policy-timeout",
}


def control_message(error: ControlError) -> str:
    """A control option's problem, naming the options as flags."""
    return error.worded(CONTROL_FLAGS)


def runaway_message(stop: RunawayStop) -> str:
    """Why a job (or one task of a suite) stopped itself, naming the limit's flag."""
    reasons = ", ".join(f"{reason} ({count})" for reason, count in stop.top_reasons) or "none recorded"
    return (f"the last {stop.consecutive} episodes were all abandoned (every attempt failed; limit "
            f"--max-consecutive-abandoned {stop.limit}); top discard reasons: {reasons}; "
            f"last error: {stop.last_error}")
