"""`demoforge repair`: LeRobot v3.0 datasets that LeRobot's own writer left broken by a SIGKILL, loadable again
with every episode whose save_episode() had returned, exactly; healthy and foreign input left alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import recorder_loop as loop
from helpers import REPO, cli_env, run_cli

pytestmark = pytest.mark.slow


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def load(root: Path, backend: str = "pyav"):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset("local/repaired", root=root, video_backend=backend)


@pytest.mark.campaign  # real kills at random moments; the suite repairs a crashed recording cut at known points
def test_real_kills_of_lerobots_writer_are_repaired_with_every_saved_episode(tmp_path: Path) -> None:
    """tools/lerobot_kill_harness.py SIGKILLs a LeRobotDataset recording loop (PNG frames with batch encoding,
    whose saved episodes exist only as PNGs: a footer-less data file and videos to encode) and checks the repair:
    it loads, and each episode whose save_episode() returned has its rows exactly and its frames at >= 30 dB.
    The harness's other seven configurations (streaming, AV1) run in tools/ (docs/reliability.md)."""
    out = tmp_path / "kills"
    repair = f"{sys.executable} -m demoforge.pipeline.cli repair {{dataset}} --out {{out}} --encode-pngs"
    done = subprocess.run([sys.executable, str(REPO / "tools" / "lerobot_kill_harness.py"), "--trials", "1",
                           "--configs", "5", "--episodes", "4", "--no-pace", "--seed", "3", "--out", str(out),
                           "--repair-cmd", repair], env=cli_env(HF_HUB_OFFLINE="1"), capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    totals = json.loads((out / "summary.json").read_text())["totals"]
    assert totals["returned_before_kill"] >= 1 and totals["recovered"] == totals["returned_before_kill"], totals
    assert totals["lost"] == 0 and totals["repair_failed"] == 0


def test_a_crashed_recording_is_repaired_in_place_and_a_cut_video_loses_only_its_episode(tmp_path: Path) -> None:
    crashed = tmp_path / "crashed"
    loop.lerobot_record(tmp_path / "recording", range(3), crashed=crashed)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    with pytest.raises(Exception):  # what the kill left does not load
        LeRobotDataset("local/crashed", root=crashed)
    snapshot = tmp_path / "snapshot"
    import shutil

    shutil.copytree(crashed, snapshot)
    done = run_cli("repair", str(crashed), "--in-place", HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recovered 3 of 3 episodes" in done.stdout and "no footer" in done.stdout
    backups = list(tmp_path.glob("crashed.broken-*"))
    assert len(backups) == 1 and files_of(backups[0]) == files_of(snapshot)  # the broken one, kept untouched
    for backend in ("pyav", "torchcodec"):
        dataset = load(crashed, backend)
        assert dataset.meta.total_episodes == 3 and len(dataset) == sum(loop.length(e) for e in range(3))
    expected = [loop.frame(e, s)["observation.state"].tolist() for e in range(3) for s in range(loop.length(e))]
    rows = pq.read_table(sorted(crashed.glob("data/*/*.parquet"))).to_pandas()
    assert [v.tolist() for v in rows["observation.state"]] == expected
    reference = json.loads((tmp_path / "recording" / "meta" / "stats.json").read_text())
    stats = json.loads((crashed / "meta" / "stats.json").read_text())
    for key in ("observation.state", "action"):  # rebuilt by LeRobot's own statistics from the same rows
        for name, value in reference[key].items():
            np.testing.assert_allclose(stats[key][name], value, rtol=1e-5, err_msg=f"{key} {name}")
    np.testing.assert_allclose(stats[loop.CAMERA]["mean"], reference[loop.CAMERA]["mean"], atol=0.02)

    # the last episode's frames cut off its camera file (as if the append had not reached the disk)
    cut = tmp_path / "cut"
    shutil.copytree(snapshot, cut)
    video = next(cut.glob("videos/*/*/*.mp4"))
    import av

    with av.open(str(video)) as source, av.open(str(tmp_path / "short.mp4"), "w") as target:
        stream = source.streams.video[0]
        copy = target.add_stream_from_template(stream)
        for number, packet in enumerate(p for p in source.demux(stream) if p.size):
            if number >= loop.length(0) + loop.length(1) + 3:
                break
            packet.stream = copy
            target.mux(packet)
    (tmp_path / "short.mp4").replace(video)
    done = run_cli("repair", str(cut), "--out", str(tmp_path / "cut-repaired"), "--json", HF_HUB_OFFLINE="1")
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["recovered"] == 2, done.stdout + done.stderr
    (lost,) = [e for e in report["episodes"] if not e["recovered"]]
    assert lost["episode_index"] == 2 and f"3 of its {loop.length(2)} frames" in lost["reason"]
    assert load(tmp_path / "cut-repaired").meta.total_episodes == 2


def test_a_healthy_dataset_is_left_alone_and_foreign_input_is_refused(tmp_path: Path) -> None:
    healthy = loop.lerobot_record(tmp_path / "healthy", range(2))
    before = files_of(healthy)
    done = run_cli("repair", str(healthy), HF_HUB_OFFLINE="1")
    assert done.returncode == 0 and "healthy" in done.stdout and "nothing written" in done.stdout, done.stdout
    assert files_of(healthy) == before and not (tmp_path / "healthy-repaired").exists()

    (tmp_path / "empty").mkdir()
    old = tmp_path / "old" / "meta"
    old.mkdir(parents=True)
    (old / "info.json").write_text(json.dumps({"codebase_version": "v2.1", "fps": 30, "features": {}}))
    garbled = tmp_path / "garbled" / "meta"
    garbled.mkdir(parents=True)
    (garbled / "info.json").write_text("{not json")
    from demoforge.storage.lerobot.repair import RepairError, repair_dataset

    for path, message in ((tmp_path / "empty", "meta/info.json is missing"),
                          (tmp_path / "garbled", "not readable JSON"),
                          (tmp_path / "nowhere", "is not a directory")):
        with pytest.raises(RepairError, match=message):
            repair_dataset(path)
    with pytest.raises(RepairError, match="exists; repair writes a new dataset"):
        repair_dataset(healthy, tmp_path / "old")
    done = run_cli("repair", str(tmp_path / "old"), HF_HUB_OFFLINE="1")  # as a person sees it: a line, exit 2
    assert done.returncode == 2 and "LeRobot 'v2.1' dataset; repair reads v3.0" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "garbled", "healthy", "old"]
