"""Reactive experts as segments: a policy that maps each observation to an action, cut into lazily planned
segments at the steps where the expert changes phase.

Most scripted experts people already have are reactive (Meta-World ships one per task): every step they read
the state, pick a target with if-branches, and return an action. Such an expert has no plan to hand over, but
it does have phases — the branch of its target selection, the gripper closing or opening, a task predicate —
and those are the segments a demonstration should carry. :func:`reactive_segments` turns an expert that
reports its phase with each action into the contract's segment stream: a segment runs while the expert stays
in one phase and ends exactly at the step where the phase changes; the next segment begins from the state the
previous one left (the action the expert chose there is the new segment's first). The episode ends when the
env terminates (success) or truncates, as for any task.

:class:`ReturnBranch` reads "which branch" from an expert's own code without changing it: the ordinal of the
``return`` statement a function last executed in this thread (Python 3.12's ``sys.monitoring``, local
``PY_RETURN`` events on that function's code only, so nothing else is slowed down). It reads the function's
bytecode (which instructions return), which changes between CPython versions: elsewhere than on the versions it
is tested on (:data:`RETURN_BRANCH_PYTHONS`) it refuses with :class:`ReturnBranchUnsupported`.
"""

from __future__ import annotations

import dis
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from demoforge.stages.contract import Segment, TaskProtocolError

#: The CPython versions whose return instructions :class:`ReturnBranch` knows (``RETURN_VALUE``, ``RETURN_CONST``).
RETURN_BRANCH_PYTHONS: tuple[tuple[int, int], ...] = ((3, 12),)


class ReturnBranchUnsupported(RuntimeError):
    """:class:`ReturnBranch` cannot run on this Python: it reads CPython bytecode of the versions it is tested on."""

    def __init__(self, implementation: str, version: tuple[int, int]) -> None:
        self.implementation, self.version = implementation, version
        tested = ", ".join(f"{major}.{minor}" for major, minor in RETURN_BRANCH_PYTHONS)
        super().__init__(f"ReturnBranch reads CPython {tested} bytecode; this is {implementation} "
                         f"{version[0]}.{version[1]}: cut the expert's segments with a phase function instead "
                         "(PolicyExpert)")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses processes with its facts
        return type(self), (self.implementation, self.version)


def _check_python() -> None:
    version = (sys.version_info.major, sys.version_info.minor)
    if sys.implementation.name != "cpython" or version not in RETURN_BRANCH_PYTHONS:
        raise ReturnBranchUnsupported(sys.implementation.name, version)


@dataclass(frozen=True)
class Phase:
    """One phase of a reactive expert: its segment's name, instruction, target and metadata.

    Two decisions belong to the same segment exactly when their phases are equal.
    """

    name: str
    instruction: str | None = None
    target: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


class ReactiveExpert(Protocol):
    """An expert that decides one action per observation and says which phase it is in."""

    def decide(self, observation: Any) -> tuple[Any, Phase]:
        """The action for ``observation`` and the expert's phase when it chose it."""
        ...


@dataclass(frozen=True)
class PolicyExpert:
    """A :class:`ReactiveExpert` from two callables: ``act(observation) -> action`` and
    ``phase(observation) -> Phase | str`` (a task predicate; a string is a phase of that name), evaluated on the
    same observation, ``act`` first."""

    act: Callable[[Any], Any]
    phase: Callable[[Any], Phase | str]

    def decide(self, observation: Any) -> tuple[Any, Phase]:
        action = self.act(observation)
        phase = self.phase(observation)
        return action, phase if isinstance(phase, Phase) else Phase(str(phase))


class _Cut:
    """Where one segment's action stream handed over to the next: the decision that began the new phase."""

    def __init__(self) -> None:
        self.next: tuple[Any, Phase] | None = None


def _decide(expert: ReactiveExpert, observation: Any) -> tuple[Any, Phase]:
    decision = expert.decide(observation)
    if not (isinstance(decision, tuple) and len(decision) == 2 and isinstance(decision[1], Phase)):
        raise TaskProtocolError(f"{type(expert).__name__}.decide returned {decision!r:.80}; expected "
                                "(action, Phase)")
    if not isinstance(decision[1].name, str) or not decision[1].name:
        raise TaskProtocolError(f"{type(expert).__name__}.decide returned a phase without a name")
    return decision


def _phase_actions(expert: ReactiveExpert, observe: Callable[[], Any], first: tuple[Any, Phase],
                   cut: _Cut) -> Iterator[Any]:
    """The actions of one phase: the first decision's action, then one decision per step (each from the state
    the previous action left) until the expert's phase differs; that decision is kept for the next segment."""
    action, phase = first
    yield action
    while True:
        action, now = _decide(expert, observe())
        if now != phase:
            cut.next = (action, now)
            return
        yield action


def reactive_segments(expert: ReactiveExpert, observe: Callable[[], Any]) -> Iterator[Segment]:
    """The contract's lazy segment stream of a reactive expert: one segment per run of equal phases.

    ``observe()`` returns the env's latest observation (a task wrapper keeps it from ``reset`` and ``step``).
    Each segment is planned when the previous one ended, from the state it left; the stream has no end of its
    own: the episode ends when the env terminates or truncates.
    """
    decision = _decide(expert, observe())
    while True:
        cut = _Cut()
        phase = decision[1]
        yield Segment(actions=_phase_actions(expert, observe, decision, cut), name=phase.name,
                      target=phase.target, instruction=phase.instruction, metadata=dict(phase.metadata))
        if cut.next is None:
            raise TaskProtocolError(f"segment {phase.name!r} was asked to end before its expert changed phase")
        decision = cut.next


# ------------------------------------------------------------------------------------------ branches
class _ReturnMonitor:
    """The process's one ``sys.monitoring`` tool for return branches (tool ids are a per-process resource, so
    this one object is shared: it claims an id on first use and keeps a per-thread "last return" per code)."""

    _lock = threading.Lock()
    _instance: _ReturnMonitor | None = None

    def __init__(self) -> None:
        monitoring = sys.monitoring
        for tool in (4, 3):  # 0-2 and 5 are taken by convention (debugger, coverage, profiler, optimizer)
            if monitoring.get_tool(tool) is None:
                monitoring.use_tool_id(tool, "demoforge.reactive")
                break
        else:
            raise RuntimeError("no free sys.monitoring tool id (3 and 4 are in use by other tools)")
        self.tool = tool
        self.local = threading.local()
        self.watched: set[types.CodeType] = set()
        monitoring.register_callback(tool, monitoring.events.PY_RETURN, self._returned)

    @classmethod
    def get(cls) -> _ReturnMonitor:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _returned(self, code: types.CodeType, offset: int, _value: object) -> None:
        last = getattr(self.local, "last", None)
        if last is None:
            last = self.local.last = {}
        last[code] = offset

    def watch(self, code: types.CodeType) -> None:
        with self._lock:
            if code not in self.watched:
                sys.monitoring.set_local_events(self.tool, code, sys.monitoring.events.PY_RETURN)
                self.watched.add(code)

    def last(self, code: types.CodeType) -> int | None:
        return (getattr(self.local, "last", None) or {}).get(code)

    def forget(self, code: types.CodeType) -> None:
        (getattr(self.local, "last", None) or {}).pop(code, None)


class ReturnBranch:
    """Which ``return`` statement of ``function`` ran last in this thread, as its ordinal in source order
    (0 for the first ``return`` in the function's text).

    ``clear()`` before calling the expert, ``last()`` after: None when the function did not return since (it
    was not called, or it raised). Raises :class:`ReturnBranchUnsupported` on a Python it is not tested on.
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        _check_python()
        code = getattr(function, "__code__", None)
        if not isinstance(code, types.CodeType):
            raise TypeError(f"{function!r} has no Python code to watch")
        returns = [i for i in dis.get_instructions(code) if i.opname in ("RETURN_VALUE", "RETURN_CONST")]
        lines = sorted({i.positions.lineno for i in returns if i.positions and i.positions.lineno is not None})
        self._ordinal = {i.offset: lines.index(i.positions.lineno) for i in returns
                         if i.positions and i.positions.lineno is not None}
        self.count = len(lines)  # the number of return statements
        self.name = code.co_qualname
        self._code = code
        self._monitor = _ReturnMonitor.get()
        self._monitor.watch(code)

    def clear(self) -> None:
        self._monitor.forget(self._code)

    def last(self) -> int | None:
        offset = self._monitor.last(self._code)
        return None if offset is None else self._ordinal.get(offset)
