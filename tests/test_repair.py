"""`demoforge repair`: LeRobot v3.0 datasets that LeRobot's own writer left broken by a SIGKILL, loadable again
with every episode whose save_episode() had returned, exactly; healthy and foreign input left alone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import recorder_loop as loop
from helpers import REPO, cli_env, demoforge_argv, run_cli

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
    assert "recovered 3 of 3 episode(s)" in done.stdout and "no footer" in done.stdout
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


@pytest.fixture(scope="module")
def crashed(tmp_path_factory) -> Path:
    """A LeRobot recording of 3 episodes as a kill before finalize() leaves it (shared: tests copy it)."""
    root = tmp_path_factory.mktemp("crashed")
    loop.lerobot_record(root / "recording", range(3), crashed=root / "crashed")
    return root / "crashed"


def cut(path: Path, fraction: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * fraction)])


def test_episodes_cut_off_with_the_data_file_are_counted_and_named(crashed: Path, tmp_path: Path) -> None:
    """A data file cut to 60 %: the episodes info.json counts and no row group holds are lost, named in the report
    (its count agrees with info.json), and the repaired info.json counts what was recovered."""
    broken = tmp_path / "broken"
    shutil.copytree(crashed, broken)
    cut(next(broken.glob("data/*/*.parquet")), 0.6)
    done = run_cli("repair", str(broken), "--json", HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    before = json.loads((crashed / "meta/info.json").read_text())["total_episodes"]
    assert report["recovered"] + report["lost"] == before == 3 and report["lost"] >= 1, report
    lost = [e for e in report["episodes"] if not e["recovered"]]
    assert [e["episode_index"] for e in lost] == list(range(3 - report["lost"], 3))
    assert all("none of its rows is in the data files" in e["reason"] or "frame" in e["reason"] for e in lost)
    after = json.loads((tmp_path / "broken-repaired/meta/info.json").read_text())
    assert after["total_episodes"] == report["recovered"]
    assert load(tmp_path / "broken-repaired").meta.total_episodes == report["recovered"]


def test_a_video_cut_mid_packet_loses_only_the_episodes_it_cuts(crashed: Path, tmp_path: Path) -> None:
    """The camera file cut at 75 % of its bytes (its last packet cut short: frames that wait for it do not
    decode): the episodes whose frames are all before the cut are kept and load; the others are named."""
    broken = tmp_path / "broken"
    shutil.copytree(crashed, broken)
    cut(next(broken.glob("videos/*/*/*.mp4")), 0.75)
    done = run_cli("repair", str(broken), "--out", str(tmp_path / "fixed"), HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cut short" in done.stdout and "lost: episode 2" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    dataset = load(tmp_path / "fixed")
    assert dataset.meta.total_episodes >= 1 and dataset[len(dataset) - 1] is not None


def test_outputs_in_the_source_and_bad_codecs_are_refused_before_anything_is_read(crashed: Path,
                                                                                   tmp_path: Path) -> None:
    from demoforge.storage.lerobot.repair import RepairError, repair_dataset

    broken = tmp_path / "broken"
    shutil.copytree(crashed, broken)
    before = files_of(broken)
    for out, message in ((broken / "sub", "is inside the dataset to repair"), (broken, "is the dataset to repair"),
                         (tmp_path, "holds the dataset to repair")):
        with pytest.raises(RepairError, match=message):
            repair_dataset(broken, out)
    with pytest.raises(RepairError, match="Invalid vcodec 'bogus'"):
        repair_dataset(tmp_path / "nowhere", encode_pngs=True, vcodec="bogus")  # checked first: nothing is read
    with pytest.raises(RepairError, match="give --encode-pngs too"):
        repair_dataset(broken, vcodec="h264")
    done = run_cli("repair", str(broken), "--out", str(broken / "sub"), HF_HUB_OFFLINE="1")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "repair writes a new dataset beside the broken one" in done.stderr
    assert files_of(broken) == before and sorted(p.name for p in tmp_path.iterdir()) == ["broken"]


def test_encode_pngs_says_what_images_holds_and_ffmpeg_stays_quiet(tmp_path: Path) -> None:
    """A recording with batch encoding killed after two saves: its frames are only PNGs. The report says images/
    holds the only copy of the saved episodes' frames and that --encode-pngs encodes them, never that they are
    lost; FFmpeg's notes ("moving the moov atom") do not reach the terminal."""
    from lerobot.configs.video import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    recording = LeRobotDataset.create("local/png", fps=30, features=loop.FEATURES, root=tmp_path / "recording",
                                      use_videos=True, rgb_encoder=RGBEncoderConfig(vcodec="h264"),
                                      streaming_encoding=False, batch_encoding_size=3)
    for episode in range(2):
        for step in range(loop.length(episode)):
            recording.add_frame(loop.frame(episode, step))
        recording.save_episode()
    shutil.copytree(tmp_path / "recording", tmp_path / "crashed")  # what a kill before the third save leaves
    without = run_cli("repair", str(tmp_path / "crashed"), "--dry-run", HF_HUB_OFFLINE="1")
    assert without.returncode == 1 and "--encode-pngs encodes them" in without.stdout, without.stdout
    done = run_cli("repair", str(tmp_path / "crashed"), "--encode-pngs", "--out", str(tmp_path / "fixed"),
                   HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "images/ holds the only copy of the frames of saved episode(s) 0, 1" in done.stdout, done.stdout
    assert "lost" not in done.stdout and "recovered 2 of 2 episode(s)" in done.stdout, done.stdout
    assert "moov atom" not in done.stderr and done.stderr.strip() == "", done.stderr
    assert load(tmp_path / "fixed").meta.total_episodes == 2


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A 2-episode demoforge export (`base/store`, `base/ds`) of the toy task."""
    root = tmp_path_factory.mktemp("exported")
    done = run_cli("generate", "--task", "toy-point", "--codec", "h264", "--option", "steps=8", "--episodes", "2",
                   "--store", str(root / "store"), "--export", str(root / "ds"))
    assert done.returncode == 0, done.stderr
    return root


def test_a_demoforge_export_repaired_stays_a_demoforge_dataset(exported: Path, tmp_path: Path) -> None:
    """In place, with meta/episodes deleted: a new version of the dataset, with its episode records and marker,
    which export, edit, verify and validate accept. Into a new folder, with the data file cut inside its second
    episode (the language columns' arrow.json type in the footer rebuilt): the lost episode is named, and the next
    export of the store brings it back."""
    from demoforge.storage.lerobot.edit import edit_dataset
    from demoforge.storage.lerobot.export import export_store
    from demoforge.storage.lerobot.format import read_sidecar
    from demoforge.storage.lerobot.validate import validate_dataset
    from demoforge.storage.lerobot.file_checksums import verify_dataset

    copy = tmp_path / "copy"
    shutil.copytree(exported, copy, symlinks=True)
    dataset = copy / "ds"
    records = read_sidecar(dataset)
    shutil.rmtree(dataset.resolve() / "meta" / "episodes")
    done = run_cli("repair", str(dataset), "--in-place", HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert dataset.is_symlink() and dataset.resolve().name == "v000002", dataset.resolve()
    assert read_sidecar(dataset) == records and not verify_dataset(dataset).problems
    assert list(copy.glob("ds.broken-*"))  # the broken version, kept
    report = validate_dataset(dataset, expect_segments=2)
    assert report.status == 0 and report.annotations == "checked", report.problems
    assert export_store(copy / "store", dataset).total_episodes == 2  # nothing new, and accepted
    assert edit_dataset(dataset, delete="0", dry_run=True).outputs[0].episodes == 1

    cut_copy = tmp_path / "cut"
    shutil.copytree(exported, cut_copy, symlinks=True)
    data = next((cut_copy / "ds").resolve().glob("data/*/*.parquet"))
    column = pq.ParquetFile(data).metadata.row_group(1).column(0)
    second = column.dictionary_page_offset or column.data_page_offset
    data.write_bytes(data.read_bytes()[:second + 20])
    done = run_cli("repair", str(cut_copy / "ds"), "--out", str(cut_copy / "fixed"), "--json", HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["recovered"], report["lost"]) == (1, 1), report
    assert not verify_dataset(cut_copy / "fixed").problems
    assert export_store(cut_copy / "store", cut_copy / "fixed").total_episodes == 2  # the lost one, back
    assert validate_dataset(cut_copy / "fixed", expect_segments=2).status == 0


def test_an_unwritable_output_folder_is_an_os_error_named_in_a_few_lines(crashed: Path, tmp_path: Path) -> None:
    """Exit 4 (an OS error while writing, as `demoforge --help` documents), naming the repaired dataset and where;
    the source untouched. As root, permission bits hold only without CAP_DAC_OVERRIDE: the command runs so."""
    import os
    import shutil as sh
    import stat

    prefix: list[str] = []
    if os.geteuid() == 0:
        if sh.which("setpriv") is None:
            pytest.skip("root without setpriv: permission bits cannot be made to hold")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
    parent = tmp_path / "readonly"
    parent.mkdir()
    broken = parent / "broken"
    shutil.copytree(crashed, broken)
    before = files_of(broken)
    parent.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    try:
        for args in ((str(broken), "--in-place"), (str(broken),)):
            done = subprocess.run([*prefix, *demoforge_argv("repair", *args)], env=cli_env(HF_HUB_OFFLINE="1"),
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 4, done.stdout + done.stderr
            assert "Permission denied" in done.stderr and "the repaired dataset" in done.stderr, done.stderr
            assert "make that folder writable" in done.stderr and "free some space" not in done.stderr, done.stderr
            assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    finally:
        parent.chmod(stat.S_IRWXU)
    assert files_of(broken) == before and sorted(p.name for p in parent.iterdir()) == ["broken"]
