"""The power-cut file system (tools/powercut_fs.py) on its own: real FUSE mounts, real system calls.

What it must model for the power-cut campaign to mean anything: fsynced data survives and unsynced data does
not; a name survives only once its folder is fsynced; a rename made durable by a folder fsync; a name made
durable before its data is an empty file; the harsher modes; a real SQLite process keeps every transaction
it committed with ``synchronous=FULL`` and loses some with ``synchronous=OFF``. No skip: a machine without
FUSE fails these tests loudly (CI runs as root with /dev/fuse).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from demoforge.storage.durable import fsync_dir as sync_dir
from helpers import REPO

sys.path.insert(0, str(REPO / "tools"))

from powercut_fs import PowerCut  # noqa: E402


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[PowerCut]:
    mounted = PowerCut(tmp_path / "disk", tmp_path / "mnt").mount()  # FuseUnavailable fails the test
    yield mounted
    if mounted.proc is not None and mounted.proc.poll() is None:
        mounted.unmount()


def write(path: Path, data: bytes, *, sync: bool = False) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def remount(fs: PowerCut, **kw: object) -> PowerCut:
    return PowerCut(fs.backing, fs.mountpoint, **kw).mount()  # type: ignore[arg-type]


def test_fsynced_data_and_names_survive_a_cut_and_the_rest_does_not(fs):
    m, disk = fs.mountpoint, fs.backing
    write(m / "synced", b"kept", sync=True)
    write(m / "name-only", b"lost bytes")  # its name becomes durable below, its data never does
    sync_dir(m)
    write(m / "never-named", b"x", sync=True)  # data fsynced, but its folder never is
    os.mkdir(m / "sub")
    write(m / "sub" / "f", b"y", sync=True)
    sync_dir(m / "sub")  # "sub" itself was never fsynced into the root
    assert (m / "name-only").read_bytes() == b"lost bytes"  # while mounted: the page cache's view
    assert sorted(os.listdir(m)) == ["name-only", "never-named", "sub", "synced"]
    done = fs.cut()
    assert done["why"] == "cut"
    assert sorted(os.listdir(disk)) == ["name-only", "synced"]
    assert (disk / "synced").read_bytes() == b"kept"
    assert (disk / "name-only").read_bytes() == b""  # the zero-length file after a crash


def test_an_overwrite_that_was_not_fsynced_is_lost(fs):
    m = fs.mountpoint
    write(m / "f", b"version 1", sync=True)
    sync_dir(m)
    with open(m / "f", "r+b") as f:
        f.write(b"VERSION 2 and longer")
    fs.cut()
    assert (fs.backing / "f").read_bytes() == b"version 1"


def test_a_rename_is_durable_once_its_folder_is_fsynced(fs):
    m, disk = fs.mountpoint, fs.backing
    write(m / "a.tmp", b"new", sync=True)
    write(m / "b.tmp", b"other", sync=True)
    sync_dir(m)
    os.rename(m / "a.tmp", m / "a")
    sync_dir(m)
    os.rename(m / "b.tmp", m / "b")  # not followed by a folder fsync
    os.unlink(m / "a")  # nor is this unlink
    fs.cut()
    assert sorted(os.listdir(disk)) == ["a", "b.tmp"]
    assert (disk / "a").read_bytes() == b"new"


def test_a_cross_folder_rename_is_made_durable_whole(fs):
    m, disk = fs.mountpoint, fs.backing
    os.mkdir(m / "src")
    os.mkdir(m / "dst")
    write(m / "src" / "f", b"data", sync=True)
    sync_dir(m / "src")
    sync_dir(m / "dst")
    sync_dir(m)
    os.rename(m / "src" / "f", m / "dst" / "f")
    sync_dir(m / "dst")  # the destination's fsync commits the rename; the source loses the name too
    fs.cut()
    assert os.listdir(disk / "src") == [] and os.listdir(disk / "dst") == ["f"]


def test_hard_links_symlinks_and_a_clean_unmount_keep_everything(fs):
    m, disk = fs.mountpoint, fs.backing
    os.mkdir(m / "d")
    write(m / "d" / "f", b"shared")
    os.link(m / "d" / "f", m / "g")
    os.symlink("d/f", m / "link")
    fs.unmount()  # sync + umount: nothing is lost
    assert (disk / "g").read_bytes() == b"shared" and os.readlink(disk / "link") == "d/f"
    assert os.stat(disk / "g").st_ino == os.stat(disk / "d" / "f").st_ino
    again = remount(fs)
    try:
        assert (m / "link").read_bytes() == b"shared"
        assert os.stat(m / "g").st_nlink == 2
    finally:
        again.unmount()


def test_an_armed_cut_kills_the_writer_in_the_act_and_fails_what_follows(fs, tmp_path):
    m = fs.mountpoint
    script = ("import os, sys\n"
              "for i in range(100000):\n"
              "    fd = os.open(sys.argv[1] + f'/f{i}', os.O_CREAT | os.O_WRONLY)\n"
              "    os.write(fd, b'x' * 10); os.fsync(fd); os.close(fd)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(m)], start_new_session=True,
                            stderr=subprocess.DEVNULL)
    fs.arm({"at_op": 40}, kill_pgid=proc.pid)
    done = fs.wait_done(timeout=60)
    assert proc.wait(timeout=30) == -9  # SIGKILLed with its group at the cut
    assert done["cut"]["at_op"] == 40 and done["ops"] == 40
    assert done["cut"]["trail"][-1].split()[0] in ("create", "write", "fsync")
    assert os.listdir(fs.backing) == []  # the folder was never fsynced: no name survived


def test_a_trigger_on_a_path_pattern_cuts_at_that_operation(fs):
    m = fs.mountpoint
    fs.arm({"ops": ["fsync"], "path": "*/target*", "nth": 2})
    write(m / "other", b"1", sync=True)
    write(m / "target1", b"2", sync=True)
    with pytest.raises(OSError):
        write(m / "target2", b"3", sync=True)  # the second fsync matching: cut before it is applied
    done = fs.wait_done()
    assert "fsync /target2" in done["cut"]["trail"][-1]


def test_subset_mode_keeps_all_or_none_of_the_unsynced_operations(tmp_path):
    results = {}
    for p in (0.0, 1.0):
        fs = PowerCut(tmp_path / f"disk{p}", tmp_path / f"mnt{p}", mode="subset", keep_probability=p).mount()
        write(fs.mountpoint / "f", b"unsynced data")
        os.mkdir(fs.mountpoint / "d")
        fs.cut()
        results[p] = sorted(os.listdir(fs.backing))
        if p == 1.0:
            assert (fs.backing / "f").read_bytes() == b"unsynced data"
    assert results == {0.0: [], 1.0: ["d", "f"]}


def test_renames_mode_keeps_a_rename_over_a_file_but_not_the_new_data(tmp_path):
    fs = PowerCut(tmp_path / "disk", tmp_path / "mnt", mode="renames").mount()
    m = fs.mountpoint
    write(m / "config", b"old, durable", sync=True)
    sync_dir(m)
    write(m / "config.tmp", b"new, never fsynced")
    os.replace(m / "config.tmp", m / "config")  # the classic write-then-rename without fsync
    fs.cut()
    assert os.listdir(fs.backing) == ["config"]
    assert (fs.backing / "config").read_bytes() == b""  # strict mode would have kept "old, durable"


SQLITE_WRITER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA synchronous=" + sys.argv[2])
db.execute("CREATE TABLE IF NOT EXISTS t (i INTEGER)")
for i in range(100000):
    db.execute("INSERT INTO t VALUES (?)", (i,))
    print(i, flush=True)  # committed: COMMIT has returned
"""


def _sqlite_cut(tmp_path: Path, synchronous: str, at_op: int) -> tuple[int, int]:
    """Rows a real SQLite process reported committed before the cut, and rows the disk holds after it."""
    fs = PowerCut(tmp_path / f"disk-{synchronous}", tmp_path / f"mnt-{synchronous}").mount()
    proc = subprocess.Popen([sys.executable, "-c", SQLITE_WRITER, str(fs.mountpoint / "db.sqlite"), synchronous],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    fs.arm({"at_op": at_op}, kill_pgid=proc.pid)
    out, _ = proc.communicate(timeout=120)
    fs.wait_done()
    reported = len(out.split())
    db = fs.backing / "db.sqlite"
    if not db.exists():
        return reported, 0
    con = sqlite3.connect(db)
    try:
        kept = con.execute("SELECT COUNT(*) FROM t").fetchone()[0]
    except sqlite3.OperationalError:  # the table itself was never durable
        kept = 0
    finally:
        con.close()
    return reported, kept


def test_sqlite_keeps_every_committed_row_with_synchronous_full_and_loses_some_with_off(tmp_path):
    reported, kept = _sqlite_cut(tmp_path, "FULL", at_op=400)
    assert reported > 20 and kept >= reported  # a row committed at the instant of the cut may be there too
    reported, kept = _sqlite_cut(tmp_path, "OFF", at_op=400)
    assert reported > 20 and kept < reported  # the file system is strict enough to catch a missing fsync
