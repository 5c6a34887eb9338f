"""A FUSE file system that forgets what was not fsynced: power cuts for real processes (SQLite included).

    .venv/bin/python tools/powercut_fs.py BACKING MOUNTPOINT [--mode strict|subset|renames] [--seed S]
        [--keep-probability P]

A pass-through over the folder BACKING, mounted at MOUNTPOINT (root and ``/dev/fuse`` needed). While mounted,
every process sees the file system as a page cache would show it: every write, create, rename, unlink,
truncate, mkdir, link and symlink, at once. What a disk would hold is tracked apart, per inode:

- ``fsync``/``fdatasync`` of a file makes its data and size durable (its inode too, but not its names);
- ``fsync`` of a directory makes durable every pending name operation (create, mkdir, symlink, link, unlink,
  rmdir, rename) that touched that directory, in the order they ran; a rename is made durable whole (both of
  its directories), as a journaling file system commits it;
- a name made durable before its file's data was fsynced names an empty file (or the data last fsynced).

A **power cut** (:meth:`PowerCut.cut`: on command, or armed to fire at the Nth mutating operation or at the
Kth operation matching a kind and a path pattern) freezes the durable state, answers EIO to every later
request, SIGKILLs the process group it was told about (everything that ran on the "machine"), unmounts, and
writes the durable state into BACKING: afterwards BACKING is what the disk would hold. A clean unmount
(:meth:`PowerCut.unmount`, like ``sync; umount``) makes everything durable first. Mount again on BACKING to
see what survived.

Harsher models of what the disk did with the unsynced operations at the cut (``--mode``):

- ``strict`` (default): none of them reached the disk;
- ``subset``: each pending name operation and each pending data write reached it with probability
  ``--keep-probability`` (in order; a kept write may be torn at a 4 KiB boundary);
- ``renames``: every pending rename reached it, none of the data it moved (the classic zero-length file after
  a crash: ext4 ``data=writeback``, or a rename committed by the journal before the delayed data).

Control: JSON lines on standard input (``{"cmd": "arm", ...}``, ``cut``, ``stats``, ``unmount``), replies and
events (``ready``, ``cut``, ``done``) as JSON lines on standard output; :class:`PowerCut` drives it from Python.
Data lives in memory while mounted (files loaded from BACKING on first use): meant for stores of megabytes.
"""

from __future__ import annotations

import argparse
import errno
import fnmatch
import json
import os
import queue
import random
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MUTATING = ("create", "mknod", "mkdir", "symlink", "link", "unlink", "rmdir", "rename", "setattr", "write",
            "fsync", "fsyncdir")
MODES = ("strict", "subset", "renames")
TORN_UNIT = 4096
NOW = time.time_ns


# ------------------------------------------------------------------------------------------------ the model
class Durable:
    """An inode as the disk holds it. ``data`` None: the bytes of ``origin`` (the file in BACKING at mount)."""

    __slots__ = ("kind", "mode", "data", "origin", "entries", "target")

    def __init__(self, kind: int, mode: int, *, data: bytes | None = b"", origin: str | None = None,
                 target: bytes = b"") -> None:
        self.kind = kind
        self.mode = mode
        self.data = data
        self.origin = origin
        self.entries: dict[bytes, Durable] = {}
        self.target = target

    def read(self) -> bytes:
        if self.data is None:
            assert self.origin is not None
            with open(self.origin, "rb") as f:
                return f.read()
        return self.data


class Node:
    """A live inode: what every process sees while mounted."""

    __slots__ = ("ino", "kind", "mode", "uid", "gid", "_data", "origin", "size", "entries", "target", "links",
                 "atime", "mtime", "ctime", "lookups", "opens", "dirty", "log", "durable", "last_path")

    def __init__(self, ino: int, kind: int, mode: int, *, uid: int = 0, gid: int = 0, target: bytes = b"",
                 origin: str | None = None, size: int = 0) -> None:
        self.ino = ino
        self.kind = kind
        self.mode = mode
        self.uid, self.gid = uid, gid
        self._data: bytearray | None = None if origin is not None else bytearray()
        self.origin = origin
        self.size = size
        self.entries: dict[bytes, Node] = {}
        self.target = target
        self.links: list[tuple[Node, bytes]] = []  # (directory, name) of every name of this inode
        self.atime = self.mtime = self.ctime = NOW()
        self.lookups = 0
        self.opens = 0
        self.dirty = False
        self.log: list[tuple[str, int, bytes]] = []  # data operations since the last fsync (mode subset)
        self.durable: Durable | None = None
        self.last_path = b""

    @property
    def data(self) -> bytearray:
        if self._data is None:  # loaded from BACKING on first use; BACKING is never written while mounted
            assert self.origin is not None
            with open(self.origin, "rb") as f:
                self._data = bytearray(f.read())
        return self._data

    def length(self) -> int:
        return len(self._data) if self._data is not None else self.size

    def path(self) -> bytes:
        parts: list[bytes] = []
        node: Node | None = self
        seen = 0
        while node is not None and node.links and seen < 4096:
            parent, name = node.links[0]
            parts.append(name)
            node, seen = parent, seen + 1
        if self.links or self.ino == ROOT:
            self.last_path = b"/" + b"/".join(reversed(parts))
        return self.last_path


ROOT = 1


@dataclass
class MetaOp:
    """A pending name operation: ``dirs`` are the directories whose fsync makes it durable."""

    kind: str
    dirs: tuple[Node, ...]
    apply: Callable[[], None]


@dataclass
class Trigger:
    """Cut at mutating operation ``at_op``; or ``after`` mutating operations after the ``nth`` operation whose
    kind is in ``ops`` and whose path matches ``path`` (0: that operation itself is cut, before it is applied)."""

    at_op: int | None = None
    ops: tuple[str, ...] = ()
    path: str = "*"
    nth: int = 1
    after: int = 0
    seen: int = 0
    fire_at: int | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Trigger:
        return cls(at_op=d.get("at_op"), ops=tuple(d.get("ops", ())), path=d.get("path", "*"),
                   nth=int(d.get("nth", 1)), after=int(d.get("after", 0)))


class Cut(Exception):
    """Raised inside a request when the power goes: the request fails with EIO."""


class Model:
    """The live file system and what a disk would hold of it. No FUSE here: :class:`Ops` adapts it."""

    def __init__(self, backing: Path, mode: str = "strict", seed: int = 0, keep_probability: float = 0.5) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: use one of {', '.join(MODES)}")
        self.backing = Path(backing)
        self.mode = mode
        self.rng = random.Random(seed)
        self.keep = keep_probability
        self.nodes: dict[int, Node] = {}
        self.next_ino = ROOT
        self.pending: list[MetaOp] = []
        self.ops = 0  # mutating operations so far
        self.counts: Counter[str] = Counter()
        self.trail: list[str] = []  # the last operations, for "where did the cut land"
        self.triggers: list[Trigger] = []
        self.cut_info: dict[str, Any] | None = None
        self.kill_pgid: int | None = None
        self.root = self._load()
        self.durable_root = self.root.durable
        assert self.durable_root is not None

    # ------------------------------------------------------------------ loading BACKING
    def _new(self, kind: int, mode: int, **kw: Any) -> Node:
        node = Node(self.next_ino, kind, mode, **kw)
        self.nodes[node.ino] = node
        self.next_ino += 1
        return node

    def _load(self) -> Node:
        st = os.lstat(self.backing)
        root = self._new(stat.S_IFDIR, st.st_mode, uid=st.st_uid, gid=st.st_gid)
        root.durable = Durable(stat.S_IFDIR, st.st_mode)
        seen: dict[tuple[int, int], Node] = {}

        def walk(folder: Path, node: Node) -> None:
            with os.scandir(folder) as it:
                for entry in it:
                    name = os.fsencode(entry.name)
                    est = entry.stat(follow_symlinks=False)
                    key = (est.st_dev, est.st_ino)
                    child = seen.get(key)
                    if child is None:
                        kind = stat.S_IFMT(est.st_mode)
                        if kind == stat.S_IFDIR:
                            child = self._new(kind, est.st_mode, uid=est.st_uid, gid=est.st_gid)
                            child.durable = Durable(kind, est.st_mode)
                        elif kind == stat.S_IFLNK:
                            target = os.fsencode(os.readlink(entry.path))
                            child = self._new(kind, est.st_mode, target=target)
                            child.durable = Durable(kind, est.st_mode, target=target)
                        elif kind == stat.S_IFREG:
                            child = self._new(kind, est.st_mode, uid=est.st_uid, gid=est.st_gid, origin=entry.path,
                                              size=est.st_size)
                            child.durable = Durable(kind, est.st_mode, data=None, origin=entry.path)
                            seen[key] = child
                        else:
                            continue  # sockets, fifos, devices: not part of a disk image here
                        child.mtime, child.atime, child.ctime = est.st_mtime_ns, est.st_atime_ns, est.st_ctime_ns
                    child.links.append((node, name))
                    node.entries[name] = child
                    assert node.durable is not None and child.durable is not None
                    node.durable.entries[name] = child.durable
                    if child.kind == stat.S_IFDIR:
                        walk(Path(entry.path), child)

        walk(self.backing, root)
        return root

    # ------------------------------------------------------------------ durability
    def durable_of(self, node: Node) -> Durable:
        """The disk inode of ``node``; created empty when it has none (a name made durable before the data)."""
        if node.durable is None:
            node.durable = Durable(node.kind, node.mode, target=node.target)
        return node.durable

    def _link(self, directory: Node, name: bytes, node: Node) -> Callable[[], None]:
        def apply() -> None:
            self.durable_of(directory).entries[name] = self.durable_of(node)
        return apply

    def _unlink(self, directory: Node, name: bytes, node: Node) -> Callable[[], None]:
        def apply() -> None:
            d = self.durable_of(directory)
            if node.durable is not None and d.entries.get(name) is node.durable:
                del d.entries[name]
        return apply

    def _move(self, src: Node, sname: bytes, dst: Node, dname: bytes, node: Node) -> Callable[[], None]:
        def apply() -> None:
            target = self.durable_of(node)
            s, d = self.durable_of(src), self.durable_of(dst)
            if s.entries.get(sname) is target and (s is not d or sname != dname):
                del s.entries[sname]
            d.entries[dname] = target
        return apply

    def sync_file(self, node: Node) -> None:
        if node.kind != stat.S_IFREG:
            return
        d = self.durable_of(node)
        d.mode = node.mode
        if node.dirty:
            d.data, d.origin = bytes(node.data), None
        node.dirty = False
        node.log.clear()

    def sync_dir(self, directory: Node) -> None:
        keep: list[MetaOp] = []
        for op in self.pending:
            if any(d is directory for d in op.dirs):
                op.apply()
            else:
                keep.append(op)
        self.pending = keep
        self.durable_of(directory).mode = directory.mode

    def sync_all(self) -> None:
        """What ``sync`` does: every pending operation and every file's data reach the disk."""
        for op in self.pending:
            op.apply()
        self.pending = []
        for node in list(self.nodes.values()):
            if node.kind == stat.S_IFREG and node.dirty:
                self.sync_file(node)

    def power_cut(self, reason: str) -> None:
        """Freeze the disk: apply what the mode lets through of the unsynced operations; fail everything after."""
        if self.cut_info is not None:
            return
        applied = 0
        if self.mode == "subset":
            for op in self.pending:
                if self.rng.random() < self.keep:
                    op.apply()
                    applied += 1
            for node in self.nodes.values():
                if node.kind == stat.S_IFREG and node.log:
                    applied += self._apply_subset(node)
        elif self.mode == "renames":
            for op in self.pending:
                if op.kind == "rename":
                    op.apply()
                    applied += 1
        self.pending = []
        self.cut_info = {"reason": reason, "at_op": self.ops, "trail": list(self.trail[-8:]),
                         "mode": self.mode, "unsynced_applied": applied}
        if self.kill_pgid is not None:
            try:
                os.killpg(self.kill_pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _apply_subset(self, node: Node) -> int:
        base = bytearray(self.durable_of(node).read())
        kept = 0
        for kind, offset, payload in node.log:
            if self.rng.random() >= self.keep:
                continue
            kept += 1
            if kind == "t":
                _truncate(base, offset)
                continue
            if self.rng.random() < 0.25 and len(payload) > TORN_UNIT:  # torn: a prefix of whole 4 KiB units
                payload = payload[:TORN_UNIT * self.rng.randrange(1, -(-len(payload) // TORN_UNIT))]
            _write_into(base, offset, payload)
        d = self.durable_of(node)
        d.data, d.origin = bytes(base), None
        return kept

    # ------------------------------------------------------------------ counting and triggers
    def arm(self, trigger: Trigger) -> None:
        self.triggers.append(trigger)

    def count(self, op: str, node: Node | None, extra: bytes = b"") -> None:
        """Called first by every request; raises :class:`Cut` when the power is (or goes) off."""
        if self.cut_info is not None:
            raise Cut()
        if op not in MUTATING:
            return
        self.ops += 1
        self.counts[op] += 1
        path = node.path() if node is not None else b""
        if extra:
            path = path.rstrip(b"/") + b"/" + extra
        self.trail.append(f"{op} {os.fsdecode(path)}")
        if len(self.trail) > 64:
            del self.trail[:32]
        for t in self.triggers:
            if t.at_op is not None and self.ops >= t.at_op:
                self.power_cut(f"operation {self.ops} ({op})")
                raise Cut()
            if t.fire_at is None and t.ops and op in t.ops and fnmatch.fnmatchcase(os.fsdecode(path), t.path):
                t.seen += 1
                if t.seen == t.nth:
                    t.fire_at = self.ops + t.after
            if t.fire_at is not None and self.ops >= t.fire_at:
                self.power_cut(f"operation {self.ops} ({op}), {t.after} after {t.ops} #{t.nth} on {t.path}")
                raise Cut()

    # ------------------------------------------------------------------ live operations
    def create(self, parent: Node, name: bytes, kind: int, mode: int, uid: int, gid: int,
               target: bytes = b"") -> Node:
        if name in parent.entries:
            raise OSError(errno.EEXIST, "exists")
        node = self._new(kind, mode, uid=uid, gid=gid, target=target)
        node.dirty = kind == stat.S_IFREG
        parent.entries[name] = node
        node.links.append((parent, name))
        parent.mtime = parent.ctime = NOW()
        self.pending.append(MetaOp("create", (parent,), self._link(parent, name, node)))
        return node

    def link(self, node: Node, parent: Node, name: bytes) -> None:
        if name in parent.entries:
            raise OSError(errno.EEXIST, "exists")
        parent.entries[name] = node
        node.links.append((parent, name))
        node.ctime = parent.mtime = NOW()
        self.pending.append(MetaOp("link", (parent,), self._link(parent, name, node)))

    def remove(self, parent: Node, name: bytes, directory: bool) -> Node:
        node = parent.entries.get(name)
        if node is None:
            raise OSError(errno.ENOENT, "no such entry")
        if directory != (node.kind == stat.S_IFDIR):
            raise OSError(errno.ENOTDIR if directory else errno.EISDIR, "kind")
        if directory and node.entries:
            raise OSError(errno.ENOTEMPTY, "not empty")
        node.path()
        del parent.entries[name]
        node.links.remove((parent, name))
        node.ctime = parent.mtime = NOW()
        self.pending.append(MetaOp("rmdir" if directory else "unlink", (parent,), self._unlink(parent, name, node)))
        self.maybe_drop(node)
        return node

    def rename(self, src: Node, sname: bytes, dst: Node, dname: bytes, flags: int) -> None:
        node = src.entries.get(sname)
        if node is None:
            raise OSError(errno.ENOENT, "no such entry")
        other = dst.entries.get(dname)
        exchange = bool(flags & 2)
        if flags & 1 and other is not None:
            raise OSError(errno.EEXIST, "exists")
        if exchange:
            if other is None:
                raise OSError(errno.ENOENT, "no such entry")
            src.entries[sname], dst.entries[dname] = other, node
            node.links[node.links.index((src, sname))] = (dst, dname)
            other.links[other.links.index((dst, dname))] = (src, sname)
            self.pending.append(MetaOp("rename", (src, dst), self._move(src, sname, dst, dname, node)))
            self.pending.append(MetaOp("rename", (src, dst), self._link(src, sname, other)))
            return
        if other is node:
            return
        if other is not None:
            if other.kind == stat.S_IFDIR and node.kind != stat.S_IFDIR:
                raise OSError(errno.EISDIR, "is a directory")
            if other.kind != stat.S_IFDIR and node.kind == stat.S_IFDIR:
                raise OSError(errno.ENOTDIR, "not a directory")
            if other.kind == stat.S_IFDIR and other.entries:
                raise OSError(errno.ENOTEMPTY, "not empty")
            other.path()
            other.links.remove((dst, dname))
        del src.entries[sname]
        dst.entries[dname] = node
        node.links[node.links.index((src, sname))] = (dst, dname)
        node.ctime = src.mtime = dst.mtime = NOW()
        self.pending.append(MetaOp("rename", (src, dst), self._move(src, sname, dst, dname, node)))
        if other is not None:
            self.maybe_drop(other)

    def write(self, node: Node, offset: int, payload: bytes) -> None:
        _write_into(node.data, offset, payload)
        node.dirty = True
        node.mtime = node.ctime = NOW()
        if self.mode == "subset":
            node.log.append(("w", offset, bytes(payload)))

    def truncate(self, node: Node, size: int) -> None:
        _truncate(node.data, size)
        node.dirty = True
        node.mtime = node.ctime = NOW()
        if self.mode == "subset":
            node.log.append(("t", size, b""))

    def maybe_drop(self, node: Node) -> None:
        """Forget a live inode nobody can reach any more (no name, no kernel reference, not open)."""
        if not node.links and node.lookups <= 0 and node.opens <= 0 and node.ino != ROOT:
            self.nodes.pop(node.ino, None)

    # ------------------------------------------------------------------ writing the disk image
    def materialize(self) -> dict[str, int]:
        """Replace BACKING with the durable state (files the mount never changed are hard-linked, not copied)."""
        new = self.backing.with_name(self.backing.name + ".materializing")
        old = self.backing.with_name(self.backing.name + ".before-cut")
        for leftover in (new, old):
            if leftover.exists():
                shutil.rmtree(leftover)
        os.mkdir(new)
        written: dict[int, str] = {}
        counts: Counter[str] = Counter()
        on_stack: set[int] = set()

        def emit(d: Durable, path: str) -> None:
            for name, child in d.entries.items():
                p = os.path.join(path, os.fsdecode(name))
                if child.kind == stat.S_IFDIR:
                    if id(child) in on_stack or id(child) in written:
                        continue  # a directory reachable twice (never from a well-ordered history): keep one
                    written[id(child)] = p
                    os.mkdir(p)
                    on_stack.add(id(child))
                    emit(child, p)
                    on_stack.discard(id(child))
                    os.chmod(p, stat.S_IMODE(child.mode))
                    counts["dirs"] += 1
                elif child.kind == stat.S_IFLNK:
                    os.symlink(child.target, p)
                    counts["symlinks"] += 1
                elif id(child) in written:
                    os.link(written[id(child)], p)
                    counts["hard_links"] += 1
                else:
                    if child.data is None:
                        assert child.origin is not None
                        os.link(child.origin, p)
                    else:
                        with open(p, "wb") as f:
                            f.write(child.data)
                    os.chmod(p, stat.S_IMODE(child.mode))
                    written[id(child)] = p
                    counts["files"] += 1

        assert self.durable_root is not None
        emit(self.durable_root, str(new))
        os.chmod(new, stat.S_IMODE(self.durable_root.mode))
        os.rename(self.backing, old)
        os.rename(new, self.backing)
        shutil.rmtree(old)
        return dict(counts)


def _write_into(buf: bytearray, offset: int, payload: bytes) -> None:
    if offset > len(buf):
        buf.extend(bytes(offset - len(buf)))
    buf[offset:offset + len(payload)] = payload


def _truncate(buf: bytearray, size: int) -> None:
    if size < len(buf):
        del buf[size:]
    else:
        buf.extend(bytes(size - len(buf)))


# ------------------------------------------------------------------------------------------------ FUSE
def serve(backing: Path, mountpoint: Path, mode: str, seed: int, keep_probability: float) -> int:
    import pyfuse3
    import trio
    from pyfuse3 import EntryAttributes, FileInfo, FUSEError

    model = Model(backing, mode, seed, keep_probability)
    timeout = 300.0  # every change goes through the kernel, so its caches stay right

    def fail(exc: OSError) -> FUSEError:
        return FUSEError(exc.errno or errno.EIO)

    class Ops(pyfuse3.Operations):
        enable_writeback_cache = False  # every write reaches us at once: counted, and lost at a cut
        supports_dot_lookup = True

        def __init__(self) -> None:
            super().__init__()
            self.handles: dict[int, Node] = {}
            self.dir_handles: dict[int, list[tuple[bytes, Node]]] = {}
            self.next_fh = 1

        # helpers --------------------------------------------------------------
        def node(self, ino: int) -> Node:
            try:
                return model.nodes[ino]
            except KeyError:
                raise FUSEError(errno.ENOENT) from None

        def guard(self, op: str, node: Node | None, extra: bytes = b"") -> None:
            try:
                model.count(op, node, extra)
            except Cut:
                announce_cut()
                raise FUSEError(errno.EIO) from None

        def attr(self, node: Node) -> EntryAttributes:
            a = EntryAttributes()
            a.st_ino = node.ino
            a.generation = 0
            a.entry_timeout = timeout
            a.attr_timeout = timeout
            a.st_mode = node.mode
            a.st_nlink = max(1, len(node.links)) if node.kind != stat.S_IFDIR else 2 + sum(
                1 for c in node.entries.values() if c.kind == stat.S_IFDIR)
            a.st_uid, a.st_gid = node.uid, node.gid
            a.st_rdev = 0
            a.st_size = node.length() if node.kind == stat.S_IFREG else (
                len(node.target) if node.kind == stat.S_IFLNK else 4096)
            a.st_blksize = 4096
            a.st_blocks = -(-a.st_size // 512)
            a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = node.atime, node.mtime, node.ctime
            return a

        def entry(self, node: Node) -> EntryAttributes:
            node.lookups += 1
            return self.attr(node)

        def fh_for(self, node: Node) -> int:
            fh = self.next_fh
            self.next_fh += 1
            self.handles[fh] = node
            node.opens += 1
            return fh

        # requests --------------------------------------------------------------
        async def lookup(self, parent_inode: int, name: bytes, ctx: Any) -> EntryAttributes:
            self.guard("lookup", None)
            parent = self.node(parent_inode)
            if name == b".":
                return self.entry(parent)
            if name == b"..":
                return self.entry(parent.links[0][0] if parent.links else parent)
            child = parent.entries.get(name)
            if child is None:
                raise FUSEError(errno.ENOENT)
            return self.entry(child)

        async def forget(self, inode_list: Any) -> None:
            for ino, n in inode_list:
                node = model.nodes.get(ino)
                if node is not None:
                    node.lookups -= n
                    model.maybe_drop(node)

        async def getattr(self, inode: int, ctx: Any) -> EntryAttributes:
            self.guard("getattr", None)
            return self.attr(self.node(inode))

        async def setattr(self, inode: int, attr: Any, fields: Any, fh: Any, ctx: Any) -> EntryAttributes:
            node = self.node(inode)
            self.guard("setattr", node)
            if fields.update_size:
                if node.kind != stat.S_IFREG:
                    raise FUSEError(errno.EINVAL)
                model.truncate(node, attr.st_size)
            if fields.update_mode:
                node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(attr.st_mode)
            if fields.update_uid:
                node.uid = attr.st_uid
            if fields.update_gid:
                node.gid = attr.st_gid
            if fields.update_atime:
                node.atime = attr.st_atime_ns
            if fields.update_mtime:
                node.mtime = attr.st_mtime_ns
            node.ctime = NOW()
            return self.attr(node)

        async def readlink(self, inode: int, ctx: Any) -> bytes:
            self.guard("readlink", None)
            return self.node(inode).target

        def _make(self, op: str, parent_inode: int, name: bytes, kind: int, mode: int, ctx: Any,
                  target: bytes = b"") -> Node:
            parent = self.node(parent_inode)
            self.guard(op, parent, name)
            try:
                return model.create(parent, name, kind, kind | stat.S_IMODE(mode), ctx.uid, ctx.gid, target)
            except OSError as exc:
                raise fail(exc) from None

        async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> EntryAttributes:
            if stat.S_IFMT(mode) not in (stat.S_IFREG, 0):
                raise FUSEError(errno.EPERM)  # special files are not part of a disk image here
            return self.entry(self._make("mknod", parent_inode, name, stat.S_IFREG, mode, ctx))

        async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> EntryAttributes:
            return self.entry(self._make("mkdir", parent_inode, name, stat.S_IFDIR, mode, ctx))

        async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> EntryAttributes:
            return self.entry(self._make("symlink", parent_inode, name, stat.S_IFLNK, 0o777, ctx, target))

        async def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any) -> Any:
            node = self._make("create", parent_inode, name, stat.S_IFREG, mode, ctx)
            return FileInfo(fh=self.fh_for(node), keep_cache=True), self.entry(node)

        async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> EntryAttributes:
            node, parent = self.node(inode), self.node(new_parent_inode)
            self.guard("link", parent, new_name)
            try:
                model.link(node, parent, new_name)
            except OSError as exc:
                raise fail(exc) from None
            return self.entry(node)

        def _remove(self, op: str, parent_inode: int, name: bytes) -> None:
            parent = self.node(parent_inode)
            self.guard(op, parent, name)
            try:
                model.remove(parent, name, directory=op == "rmdir")
            except OSError as exc:
                raise fail(exc) from None

        async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
            self._remove("unlink", parent_inode, name)

        async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
            self._remove("rmdir", parent_inode, name)

        async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                         flags: int, ctx: Any) -> None:
            src, dst = self.node(parent_inode_old), self.node(parent_inode_new)
            self.guard("rename", src, name_old)
            try:
                model.rename(src, name_old, dst, name_new, flags)
            except OSError as exc:
                raise fail(exc) from None

        async def open(self, inode: int, flags: int, ctx: Any) -> Any:
            self.guard("open", None)
            node = self.node(inode)
            if node.kind != stat.S_IFREG:
                raise FUSEError(errno.EISDIR if node.kind == stat.S_IFDIR else errno.EINVAL)
            return FileInfo(fh=self.fh_for(node), keep_cache=True)

        async def read(self, fh: int, off: int, size: int) -> bytes:
            self.guard("read", None)
            return bytes(self.handles[fh].data[off:off + size])

        async def write(self, fh: int, off: int, buf: bytes) -> int:
            node = self.handles[fh]
            self.guard("write", node)
            model.write(node, off, buf)
            return len(buf)

        async def flush(self, fh: int) -> None:
            if model.cut_info is not None:
                raise FUSEError(errno.EIO)

        async def release(self, fh: int) -> None:
            node = self.handles.pop(fh, None)
            if node is not None:
                node.opens -= 1
                model.maybe_drop(node)

        async def fsync(self, fh: int, datasync: bool) -> None:
            node = self.handles[fh]
            self.guard("fsync", node)
            model.sync_file(node)

        async def opendir(self, inode: int, ctx: Any) -> int:
            self.guard("opendir", None)
            node = self.node(inode)
            fh = self.next_fh
            self.next_fh += 1
            self.dir_handles[fh] = [(name, child) for name, child in node.entries.items()]
            self.handles[fh] = node
            return fh

        async def readdir(self, fh: int, start_id: int, token: Any) -> None:
            self.guard("readdir", None)
            listing = self.dir_handles[fh]
            for i in range(start_id, len(listing)):
                name, child = listing[i]
                if not pyfuse3.readdir_reply(token, name, self.attr(child), i + 1):
                    return
                child.lookups += 1

        async def releasedir(self, fh: int) -> None:
            self.dir_handles.pop(fh, None)
            self.handles.pop(fh, None)

        async def fsyncdir(self, fh: int, datasync: bool) -> None:
            node = self.handles[fh]
            self.guard("fsyncdir", node)
            model.sync_dir(node)

        async def statfs(self, ctx: Any) -> Any:
            s = os.statvfs(backing)
            out = pyfuse3.StatvfsData()
            out.f_bsize, out.f_frsize = s.f_bsize, s.f_frsize
            out.f_blocks, out.f_bfree, out.f_bavail = s.f_blocks, s.f_bfree, s.f_bavail
            out.f_files, out.f_ffree, out.f_favail = s.f_files, s.f_ffree, s.f_favail
            out.f_namemax = 255
            return out

    def say(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    stop = {"why": ""}

    def announce_cut() -> None:
        if not stop["why"]:
            stop["why"] = "cut"
            say({"event": "cut", **(model.cut_info or {})})
            pyfuse3.terminate()

    def stats() -> dict[str, Any]:
        return {"ops": model.ops, "counts": dict(model.counts), "pending": len(model.pending),
                "dirty_files": sum(1 for n in model.nodes.values() if n.dirty), "cut": model.cut_info is not None,
                "triggers": [{"seen": t.seen, "fired": t.fire_at is not None} for t in model.triggers]}

    def command(msg: dict[str, Any]) -> dict[str, Any]:
        cmd = msg.get("cmd")
        if cmd == "arm":
            if msg.get("trigger"):
                model.arm(Trigger.from_json(msg["trigger"]))
            if msg.get("kill_pgid"):
                model.kill_pgid = int(msg["kill_pgid"])
            return {"reply": "arm", **stats()}
        if cmd == "cut":
            model.power_cut(str(msg.get("reason") or "commanded"))
            announce_cut()
            return {"reply": "cut", **stats()}
        if cmd == "stats":
            return {"reply": "stats", **stats()}
        if cmd == "unmount":
            stop["why"] = "unmount"
            pyfuse3.terminate()
            return {"reply": "unmount", **stats()}
        return {"reply": "error", "error": f"unknown command {cmd!r}"}

    async def control() -> None:
        stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        buf = b""
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:  # the controller went away: behave as a clean unmount
                if not stop["why"]:
                    stop["why"] = "unmount"
                    pyfuse3.terminate()
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    try:
                        say(command(json.loads(line)))
                    except Exception as exc:  # a bad command is answered, never fatal
                        say({"reply": "error", "error": f"{type(exc).__name__}: {exc}"})

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(control)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    options = set(pyfuse3.default_options) | {"fsname=powercut", "subtype=powercut"}
    pyfuse3.init(Ops(), str(mountpoint), options)
    say({"event": "ready", "mountpoint": str(mountpoint), "mode": mode, "root_ino": ROOT})
    try:
        trio.run(main)
    finally:
        pyfuse3.close(unmount=True)
    if stop["why"] != "cut":
        model.sync_all()
    written = model.materialize()
    say({"event": "done", "why": stop["why"] or "unmount", "cut": model.cut_info, "ops": model.ops,
         "counts": dict(model.counts), "written": written})
    return 0


# ------------------------------------------------------------------------------------------------ driver
class FuseUnavailable(RuntimeError):
    """The file system could not be mounted (no /dev/fuse, no fuse3, not root)."""


@dataclass
class PowerCut:
    """A mounted power-cut file system, driven from Python. ``with PowerCut(backing, mnt) as fs: ...``."""

    backing: Path
    mountpoint: Path
    mode: str = "strict"
    seed: int = 0
    keep_probability: float = 0.5
    log: Path | None = None
    proc: subprocess.Popen | None = None
    events: queue.Queue = field(default_factory=queue.Queue)
    replies: queue.Queue = field(default_factory=queue.Queue)
    cut_event: dict[str, Any] | None = None
    done_event: dict[str, Any] | None = None

    def __enter__(self) -> PowerCut:
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.unmount()

    def mount(self, timeout: float = 60.0) -> PowerCut:
        self.backing.mkdir(parents=True, exist_ok=True)
        try:
            self.mountpoint.mkdir(parents=True, exist_ok=True)
        except OSError:  # a stale mount of a file system process that died: detach it
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
            self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.log = self.log or self.backing.with_name(self.backing.name + ".fs.log")
        self.cut_event = self.done_event = None
        self.events, self.replies = queue.Queue(), queue.Queue()
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, str(self.backing), str(self.mountpoint), "--mode", self.mode,
                 "--seed", str(self.seed), "--keep-probability", str(self.keep_probability)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()
        try:
            ready = self.events.get(timeout=timeout)
        except queue.Empty:
            ready = {"event": "timeout", "seconds": timeout}
        if ready.get("event") != "ready":
            self._abort()
            tail = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
            raise FuseUnavailable(f"the power-cut file system did not mount at {self.mountpoint} ({ready}); "
                                  f"it needs root, /dev/fuse, fuse3 and pyfuse3. Its log:\n{tail}")
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "reply" in msg:
                self.replies.put(msg)
            else:
                if msg.get("event") == "cut":
                    self.cut_event = msg
                if msg.get("event") == "done":
                    self.done_event = msg
                self.events.put(msg)
        self.events.put({"event": "exited", "code": self.proc.wait()})

    def _abort(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)

    def send(self, cmd: str, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"cmd": cmd, **fields}) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:  # a file system that cut or exited meanwhile answers nothing more
            try:
                return self.replies.get(timeout=0.05)
            except queue.Empty:
                if self.proc.poll() is not None or self.done_event is not None or time.monotonic() > deadline:
                    raise
                if cmd in ("cut", "unmount") and self.cut_event is not None:
                    raise

    def arm(self, trigger: dict[str, Any] | None = None, kill_pgid: int | None = None) -> dict[str, Any]:
        return self.send("arm", trigger=trigger, kill_pgid=kill_pgid)

    def stats(self) -> dict[str, Any]:
        return self.send("stats")

    def cut(self, reason: str = "commanded") -> dict[str, Any]:
        """Cut the power now; returns once the durable state is written to BACKING (the ``done`` event)."""
        if self.cut_event is None:
            try:
                self.send("cut", reason=reason)
            except (BrokenPipeError, queue.Empty):
                pass
        return self.wait_done()

    def unmount(self) -> dict[str, Any]:
        """A clean unmount: everything reaches the disk (sync), then BACKING holds it all."""
        try:
            self.send("unmount")
        except (BrokenPipeError, queue.Empty):
            pass
        return self.wait_done()

    def wait_done(self, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while self.done_event is None:
            try:
                msg = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                self._abort()
                raise RuntimeError("the power-cut file system did not finish") from None
            if msg.get("event") == "exited":
                break
        assert self.proc is not None
        self.proc.wait(timeout=30)
        if self.done_event is None:
            raise RuntimeError(f"the power-cut file system exited {self.proc.returncode} without writing BACKING")
        return self.done_event

    def wait_cut(self, timeout: float) -> dict[str, Any] | None:
        """The cut event, if the armed trigger fires within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.cut_event is None and time.monotonic() < deadline:
            try:
                self.events.get(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                pass
        return self.cut_event


def iter_tree(root: Path) -> Iterator[Path]:
    yield from sorted(root.rglob("*"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("backing", type=Path, help="the folder that plays the disk")
    parser.add_argument("mountpoint", type=Path, help="where processes see the file system")
    parser.add_argument("--mode", choices=MODES, default="strict",
                        help="what of the unsynced operations reaches the disk at a cut (default: strict, none)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the subset mode's choices (default: 0)")
    parser.add_argument("--keep-probability", type=float, default=0.5,
                        help="subset mode: chance that each unsynced operation reached the disk (default: 0.5)")
    args = parser.parse_args(argv)
    return serve(args.backing.resolve(), args.mountpoint.resolve(), args.mode, args.seed, args.keep_probability)


if __name__ == "__main__":
    sys.exit(main())
