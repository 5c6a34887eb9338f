"""Normal scheduling priority for every thread we run, whatever a video library asks for.

SVT-AV1 (LeRobot's default encoder) asks for real-time priority twice when an encoder opens, in
``svt_av1_enc_init_handle`` / ``svt_av1_enc_init``: the calling thread switches itself to SCHED_FIFO 99
(``pthread_setschedparam(pthread_self(), SCHED_FIFO, 99)``, result ignored), and every thread it creates
(``svt_create_thread``) gets explicit SCHED_FIFO 99 attributes, retried with default attributes when
``pthread_create`` answers EPERM. Both succeed only for a thread that holds CAP_SYS_NICE (root) or a
RLIMIT_RTPRIO of 99. A real-time encoder thread preempts the simulator outright (``nice`` cannot touch it), and
every thread or process started from such a thread inherits the class.

:func:`normal_priority` is the exact fix: the thread that opens an encoder gives up CAP_SYS_NICE from its
*effective* capability set while it does (capabilities are per thread on Linux, and the threads it creates
inherit the reduced set), so both requests fail with EPERM and SVT-AV1 falls back to normal threads on its own.
The capability stays permitted and comes back afterwards. Anything that still slipped through (a process
allowed real-time priority by its RLIMIT_RTPRIO instead of a capability, or a library that does the same
another way) is put back: every thread that became real-time inside the block returns to the class and
priority it had before (a new thread: the opening thread's). No library setting turns SVT-AV1's request off.

:func:`reset_process_priority` is for processes we start (workers, the export child, Ray actors, the viewer):
they begin at normal priority whatever their parent's state. :func:`set_process_class` takes the one step below
normal we take: the encoder process's encoding threads, which yield every core to the simulator until the worker
waits for them (stages/encoder_child.py).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

REALTIME_POLICIES = frozenset({os.SCHED_FIFO, os.SCHED_RR})
NORMAL = (os.SCHED_OTHER, 0)
CAP_SYS_NICE = 23
_CAPABILITY_VERSION_3 = 0x20080522


@dataclass(frozen=True)
class ThreadSchedule:
    """One thread's scheduling class and static priority (0 for the normal classes)."""

    tid: int
    policy: int
    priority: int

    @property
    def realtime(self) -> bool:
        return self.policy in REALTIME_POLICIES


def thread_schedule(tid: int) -> ThreadSchedule | None:
    """The scheduling of one thread of this process (None: it ended meanwhile)."""
    try:
        return ThreadSchedule(tid, os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority)
    except (ProcessLookupError, PermissionError):
        return None


def thread_schedules(pid: int | str = "self") -> dict[int, ThreadSchedule]:
    """Every live thread of a process (this one by default), by thread id."""
    out: dict[int, ThreadSchedule] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for name in tids:
        schedule = thread_schedule(int(name))
        if schedule is not None:
            out[schedule.tid] = schedule
    return out


def realtime_threads(pid: int | str = "self") -> list[ThreadSchedule]:
    """The threads of a process that run in a real-time class (SCHED_FIFO or SCHED_RR)."""
    return [s for s in thread_schedules(pid).values() if s.realtime]


def _set_schedule(tid: int, policy: int, priority: int) -> bool:
    try:
        os.sched_setscheduler(tid, policy, os.sched_param(priority))
        return True
    except ProcessLookupError:  # the thread ended: nothing to put back
        return False


def _restore(before: dict[int, ThreadSchedule], default: tuple[int, int]) -> int:
    """Put every thread that is real-time now, and was not so before, back to its schedule before (a thread not
    in ``before``: ``default``, a (policy, priority) pair); returns how many were put back."""
    restored = 0
    for now in realtime_threads():
        was = before.get(now.tid)
        target = (was.policy, was.priority) if was is not None else default
        if target != (now.policy, now.priority) and _set_schedule(now.tid, *target):
            restored += 1
    return restored


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _capabilities() -> tuple[ctypes.CDLL, _CapHeader, ctypes.Array[_CapData]] | None:
    """This thread's capability sets (glibc's capget wrapper), or None where they cannot be read."""
    try:
        libc = _libc()
        header = _CapHeader(_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()
        if libc.capget(ctypes.byref(header), data) != 0:
            return None
    except (OSError, AttributeError):  # not Linux, or no capget in this C library
        return None
    return libc, header, data


def _set_sys_nice(effective: bool) -> bool:
    """Add or remove CAP_SYS_NICE in this thread's effective set; True if the set changed."""
    caps = _capabilities()
    if caps is None:
        return False
    libc, header, data = caps
    bit = 1 << CAP_SYS_NICE
    has = bool(data[0].effective & bit)
    if has == effective or (effective and not data[0].permitted & bit):
        return False
    data[0].effective = (data[0].effective | bit) if effective else (data[0].effective & ~bit)
    return libc.capset(ctypes.byref(header), data) == 0


@contextmanager
def normal_priority() -> Iterator[None]:
    """Run the block (opening a video encoder) so that no thread of this process ends up real-time by it.

    Nested blocks need nothing of their own: the inner one finds the capability already dropped and leaves it to
    the outer one to give back."""
    before = thread_schedules()
    me = before.get(threading.get_native_id())
    dropped = _set_sys_nice(effective=False)
    try:
        yield
    finally:
        if dropped:
            _set_sys_nice(effective=True)
        _restore(before, (me.policy, me.priority) if me is not None else NORMAL)


def reset_process_priority() -> int:
    """Return every real-time thread of this process to SCHED_OTHER (priority 0); how many there were.

    Called first thing by the processes demoforge starts, so they run at normal priority whatever started them."""
    return _restore({}, NORMAL)


def set_process_class(policy: int, spare: Collection[int] = ()) -> int:
    """Put every thread of this process but those in ``spare`` (thread ids) in ``policy``, one of the normal
    classes (SCHED_OTHER, SCHED_BATCH, SCHED_IDLE; never a real-time one); threads they start afterwards inherit
    it. How many it moved. For the encoder process's idle priority (stages/encoder_child.py)."""
    if policy in REALTIME_POLICIES:
        raise ValueError(f"real-time scheduling class {policy} refused: nothing demoforge starts runs real-time")
    return sum(_set_schedule(tid, policy, 0) for tid, now in thread_schedules().items()
               if tid not in spare and now.policy != policy)
