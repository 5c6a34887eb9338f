"""A real full disk: generate and the daemon on a size-limited tmpfs report it in a few lines, give the
unfinished attempt's space back, keep committed episodes, and resume once space is freed."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from demoforge.storage.catalog import Catalog
from helpers import cli_env, committed_files, daemon_events, demoforge_argv, run_cli

TMPFS_MB = 12
LEAVE_FREE = 2 * 2**20  # bytes left free before the run: a few toy episodes fit, then the disk is full


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 12 MB tmpfs, mostly taken by a filler file (deleting it is "freeing space")."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip() or proc.returncode}")
    try:
        fill(mount / "filler", shutil.disk_usage(mount).free - LEAVE_FREE)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.write(b"\0" * max(size, 0))


def committed_ids(store: Path) -> list[str]:
    catalog = Catalog(store)
    try:
        return [r.episode_id for r in catalog.committed()]
    finally:
        catalog.close()


GEN = ("generate", "--task", "toy-point", "--codec", "h264", "--option", "size=64")


def test_generate_on_a_full_disk_reports_gives_space_back_and_resumes(small_disk: Path) -> None:
    store = small_disk / "store"
    full = run_cli(*GEN, "--episodes", "100000", "--store", str(store))
    assert full.returncode == 4, full.stderr
    assert "Traceback" not in full.stderr
    lines = [line for line in full.stderr.splitlines() if line.startswith(("demoforge generate", "  "))]
    # Whichever write meets the full disk first: a staging file (the OS's words) or the catalog (SQLite's).
    assert lines[0].startswith(("demoforge generate: error: the disk is full (No space left on device) while "
                                "writing ", "demoforge generate: error: the disk is full (database or disk is full) "
                                "while writing the catalog")), full.stderr
    committed = committed_ids(store)
    assert committed, "some episodes should fit before the disk is full"
    assert f"where: {store}" in full.stderr and "free on that filesystem" in full.stderr
    assert f"safe: the {len(committed)} committed episode(s) in {store} are complete" in full.stderr
    assert "re-run the same command" in full.stderr and "exit status 4" in full.stderr
    # The unfinished attempt's space is given back at once: only committed episodes remain staged.
    staged = sorted(p.name for p in (store / "staging.zarr" / "episodes").iterdir() if p.is_dir())
    assert staged == sorted(committed)
    before = committed_files(store)

    debug = run_cli("--debug", *GEN, "--episodes", "100000", "--store", str(store))
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    assert "No space left on device" in debug.stderr or "database or disk is full" in debug.stderr

    (small_disk / "filler").unlink()  # free space, then the same command resumes
    target = len(committed_ids(store)) + 3
    resumed = run_cli(*GEN, "--episodes", str(target), "--store", str(store))
    assert resumed.returncode == 0, resumed.stderr
    assert len(committed_ids(store)) == target
    after = committed_files(store)
    assert {k: after[k] for k in before} == before
    verify = run_cli("verify", "--store", str(store))
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_daemon_on_a_full_disk_logs_write_failed_and_exits_4(small_disk: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(f"""
[job]
task = "toy-point"
episodes = "unbounded"
options = {{ steps = 20, size = 64 }}
[video]
codec = "h264"
[store]
dir = "{small_disk / 'store'}"
[metrics]
address = "off"
[disk]
min_free_mb = 0
""")
    proc = run_cli("daemon", "--config", str(job), "--json-logs", timeout=300)
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr
    events = daemon_events(proc.stderr)
    failed = [e for e in events if e["event"] == "write_failed"]
    assert len(failed) == 1, proc.stderr
    assert failed[0]["reason"] == "No space left on device"
    assert failed[0]["path"].startswith(str(small_disk / "store")) and failed[0]["free_bytes"] < LEAVE_FREE
    assert failed[0]["committed_total"] == len(committed_ids(small_disk / "store")) > 0


def fill_up(path: Path) -> None:
    """Write until the filesystem is full (what another process on a shared disk does)."""
    with open(path, "wb", buffering=0) as f:  # unbuffered: closing has nothing left to write
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_export_on_a_disk_that_fills_removes_its_unfinished_version_at_once(small_disk: Path,
                                                                            tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert run_cli(*GEN, "--episodes", "3", "--store", str(store)).returncode == 0
    (small_disk / "filler").unlink()
    dataset = small_disk / "dataset"
    # The export pauses 2 s at each step: the disk is filled by "another process" while it runs.
    proc = subprocess.Popen(demoforge_argv("export", "--store", str(store), "--out", str(dataset)),
                            env=cli_env(DEMOFORGE_EXPORT_PAUSE="2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    build = small_disk / "dataset.versions" / "v000001.partial"
    deadline = time.monotonic() + 120
    while not build.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert build.exists(), proc.communicate()[1]
    fill_up(small_disk / "other-process")
    full = shutil.disk_usage(small_disk).free
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 4, err
    assert "Traceback" not in err
    assert err.startswith("demoforge export: error: the disk is full"), err
    assert "while writing the new dataset version v000001" in err
    assert "unfinished new version was removed" in err and "exit status 4" in err
    # The unfinished version is gone now, not at the next export: its space is free again.
    assert not list((small_disk / "dataset.versions").glob("v*"))
    assert shutil.disk_usage(small_disk).free >= full  # nothing the export wrote is still held
    (small_disk / "other-process").unlink()
    again = run_cli("export", "--store", str(store), "--out", str(dataset))
    assert again.returncode == 0 and "exported 3 episode(s)" in again.stdout, again.stderr


def test_the_frames_kept_for_statistics_name_their_file_when_the_disk_is_full(small_disk: Path) -> None:
    """The encoder keeps the frames LeRobot's statistics may sample in a temporary file in the store: a full disk
    there is a named write failure (what, where), like every other write, not a bare OSError."""
    import numpy as np

    from demoforge.storage.sampled_frames import SampledFrames
    from demoforge.storage.schema import CameraSpec
    from demoforge.storage.write_errors import StorageWriteError

    fill_up(small_disk / "more")
    kept = SampledFrames(CameraSpec("front", 224, 224), spill_dir=small_disk)
    try:
        with pytest.raises(StorageWriteError) as raised:
            for _ in range(100):  # 150 KB each: the page cache's buffer gives out within a few frames
                kept.add(np.zeros((224, 224, 3), np.uint8))
            kept.statistics()
    finally:
        kept.close()
    assert "camera 'front'" in str(raised.value) and str(small_disk) in str(raised.value)


def test_dropping_kept_frames_on_a_full_disk_writes_nothing_and_frees_their_space(small_disk: Path) -> None:
    """An aborted attempt's kept frames are dropped while the disk is full to the last byte: closing writes
    nothing (frames reach the file as they are added), so clean-up cannot fail, and their space comes back."""
    import numpy as np

    from demoforge.storage.sampled_frames import SampledFrames
    from demoforge.storage.schema import CameraSpec

    (small_disk / "filler").unlink()
    kept = SampledFrames(CameraSpec("front", 16, 16), spill_dir=small_disk)
    for _ in range(5):  # 768 bytes each: a buffered file would still hold them when the disk fills
        kept.add(np.zeros((16, 16, 3), np.uint8))
    fill_up(small_disk / "more")  # the disk is full at the moment the clean-up runs
    full = shutil.disk_usage(small_disk).free
    kept.close()
    assert shutil.disk_usage(small_disk).free > full
    assert not [p for p in small_disk.iterdir() if p.name.startswith("demoforge-stats-")]


def test_an_encode_lane_whose_clean_up_fails_lets_nothing_escape_and_reports_the_first_failure() -> None:
    """The first failure (a full disk while encoding) is what the stage raises; an encoder whose clean-up then
    fails too is reported through the lane, never as a raw traceback from its thread."""
    import errno
    import threading

    import anyio
    import numpy as np

    from demoforge.stages.encode_lanes_async import AsyncLaneSet
    from demoforge.stages.records import AttemptKey, CameraTail

    class Encoder:
        made = 0

        def __init__(self) -> None:
            Encoder.made += 1
            self.fails = Encoder.made == 2  # the second attempt's encoder meets the full disk

        def encode(self, image: np.ndarray) -> bytes:
            if self.fails:
                raise OSError(errno.ENOSPC, "No space left on device (first)")
            return b"frame"

        def finish(self) -> CameraTail:
            raise AssertionError("no attempt is kept here")

        def abort(self) -> None:
            raise OSError(errno.ENOSPC, "No space left on device (clean-up)")

    escaped: list[object] = []
    hook = threading.excepthook
    threading.excepthook = escaped.append

    async def main() -> None:
        lanes = AsyncLaneSet({"front": Encoder})
        try:
            image = np.zeros((8, 8, 3), np.uint8)
            lanes.submit_frame(AttemptKey(0, 0), {"front": image})
            lanes.submit_frame(AttemptKey(1, 0), {"front": image})
            with pytest.raises(OSError, match=r"\(first\)"):
                for _ in range(2):
                    await lanes.next_result()
        finally:
            await lanes.close()

    try:
        anyio.run(main)
    finally:
        threading.excepthook = hook
    assert escaped == []
