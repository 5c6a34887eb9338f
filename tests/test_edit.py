"""`demoforge edit` / `demoforge merge`: lossless (packets hashed), consistent (rows, stats, tasks, sidecar,
marker, checksums), loadable by LeRobot with both video backends, replayable; bad input is exit 2 with nothing
written; foreign LeRobot datasets are smart-cut (only frames before a keyframe re-encoded, and reported);
the viewer's rejected list is applied. Kill tests are in tests/test_edit_crash.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import toy_tasks  # noqa: F401
from demoforge.pipeline.cli import main
from demoforge.storage.lerobot.edit import ALREADY, UNCHANGED, WRITTEN, edit_dataset, merge_datasets
from demoforge.storage.lerobot.export import export_stores
from demoforge.storage.lerobot.format import ExportMarker
from edit_helpers import (
    CAM,
    continuous_reencode,
    copy_dataset,
    data_rows,
    episode_frames,
    episodes_meta,
    lerobot_written_dataset,
    packet_hashes,
    sidecar,
    toy_store,
    tree,
    violations,
)
from helpers import psnr

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_tasks(tmp_path_factory):
    """A dataset of two jobs (tasks toy-point and toy-noisy, 5 + 3 episodes, h264), and its stores."""
    root = tmp_path_factory.mktemp("edit")
    point, noisy = toy_store(root / "point", 5), toy_store(root / "noisy", 3, task="toy-noisy")
    dataset = root / "dataset"
    export_stores([point, noisy], dataset)
    return {"root": root, "dataset": dataset, "point": point, "noisy": noisy}


def test_delete_copies_packets_renumbers_everything_and_an_export_never_adds_them_back(two_tasks, tmp_path):
    from lerobot.datasets.compute_stats import aggregate_stats
    from lerobot.datasets.io_utils import load_stats

    from demoforge.pipeline.replay_run import run_replay

    source = two_tasks["dataset"]
    dataset = copy_dataset(source, tmp_path)
    before_sidecar, before_meta = sidecar(source), episodes_meta(source)
    kept = [0, 2, 5, 7]
    report = edit_dataset(dataset, delete="1,3-4,6")
    (out,) = report.outputs
    assert (out.status, out.version, out.episodes, out.reencoded_frames) == (WRITTEN, "v000002", 4, 0)
    assert report.removed == {"deleted": 4}
    assert violations(dataset, backends=("pyav", "torchcodec")) == []

    for new, old in enumerate(kept):  # packets, rows and records of each kept episode are the source's
        assert packet_hashes(dataset, new) == packet_hashes(source, old)
        assert data_rows(dataset, new) == data_rows(source, old)
        assert sidecar(dataset)[new] == {**before_sidecar[old], "dataset_episode_index": new}
    meta = episodes_meta(dataset)
    assert [m["episode_index"] for m in meta] == [0, 1, 2, 3]
    assert [m["length"] for m in meta] == [before_meta[i]["length"] for i in kept]
    assert [m["dataset_from_index"] for m in meta] == [0, 20, 40, 60]
    assert [m["stats/episode_index/max"] for m in meta] == [[0], [1], [2], [3]]  # recomputed, not stale
    # stats.json: LeRobot's aggregation of the kept episodes' per-episode stats (nothing decoded)
    root = dataset.resolve()
    stats = load_stats(root)
    parts: list[dict[str, dict[str, Any]]] = [{k.split("/")[1]: {} for k in m if k.startswith("stats/")}
                                              for m in meta]
    for part, m in zip(parts, meta):
        for k, v in m.items():
            if k.startswith("stats/"):
                _, feature, stat = k.split("/")
                part[feature][stat] = np.asarray(v)
    expected = aggregate_stats(parts)
    for feature in ("action", "observation.state", CAM):
        np.testing.assert_allclose(stats[feature]["mean"], expected[feature]["mean"])
    frames = np.concatenate([np.asarray(data_rows(source, i)["action"]) for i in kept])
    np.testing.assert_allclose(stats["action"]["mean"], frames.mean(axis=0), rtol=1e-6)

    marker = ExportMarker.read(root)
    assert marker.total_episodes == 4 and [e.dataset_index for e in marker.episodes] == [0, 1, 2, 3]
    assert sorted((r.store_id, r.episode_id) for r in marker.removed) == \
        sorted((before_sidecar[i]["store_id"], before_sidecar[i]["staging_episode_id"]) for i in (1, 3, 4, 6))
    replayed = run_replay(dataset, episodes="0-1")  # the toy-point ones (toy-noisy is not reproducible by design)
    assert replayed.exit_code == 0 and replayed.counts()["reproduced"] == 2

    # an export from the stores adds nothing: the deleted episodes are not exported again
    again = export_stores([two_tasks["point"], two_tasks["noisy"]], dataset)
    assert again.exported == 0 and len(again.removed_by_edit) == 4

    # the same edit run again is reported, not applied twice; --again applies it
    rerun = edit_dataset(dataset, delete="1,3-4,6")
    assert rerun.outputs[0].status == ALREADY and "already the result" in rerun.notes[0]
    assert edit_dataset(dataset, delete="1", again=True).outputs[0].episodes == 3


def test_task_and_keep_where_filter_and_the_tasks_are_renumbered(two_tasks, tmp_path):
    import pandas as pd

    dataset = copy_dataset(two_tasks["dataset"], tmp_path)
    before = sidecar(dataset)
    report = edit_dataset(dataset, task="toy-noisy")
    assert report.outputs[0].episodes == 3 and report.removed == {"not task 'toy-noisy'": 5}
    tasks = pd.read_parquet(dataset.resolve() / "meta" / "tasks.parquet")
    assert list(tasks.index) == ["toy-noisy"] and list(tasks["task_index"]) == [0]
    table = data_rows(dataset, 0)
    assert table and set(pd.read_parquet(sorted(dataset.resolve().glob("data/*/*.parquet"))[0])["task_index"]) == {0}
    assert [r["staging_episode_id"] for r in sidecar(dataset)] == [r["staging_episode_id"] for r in before[5:]]
    assert violations(dataset) == []

    from demoforge.storage.lerobot.episode_filter import parse_filter

    # --out: the same selection as a new dataset; the source stays as it is
    points = edit_dataset(two_tasks["dataset"], task="toy-point", out=tmp_path / "points")
    assert points.outputs[0].episodes == 5 and published_versions(two_tasks["dataset"]) == ["v000001"]
    assert violations(tmp_path / "points") == []

    kept = edit_dataset(dataset, keep_where=parse_filter('index != 1 and (outcome == "success" or length < 0)'))
    assert kept.outputs[0].episodes == 2 and kept.removed == {"--keep-where": 1}
    assert edit_dataset(dataset, keep_where=parse_filter("success")).outputs[0].status == UNCHANGED


def test_split_is_deterministic_stratified_and_merging_the_parts_gives_the_dataset_back(two_tasks, tmp_path):
    source = two_tasks["dataset"]
    before = tree(source.resolve())
    ids = {(r["store_id"], r["staging_episode_id"]): i for i, r in enumerate(sidecar(source))}
    report = edit_dataset(source, split=_split("train=0.5,val=0.5"), seed=3, stratify="task",
                          out_root=tmp_path / "parts")
    assert [o.status for o in report.outputs] == [WRITTEN, WRITTEN]
    assert tree(source.resolve()) == before  # the dataset split is not changed
    parts = {name: [(r["store_id"], r["staging_episode_id"]) for r in sidecar(tmp_path / "parts" / name)]
             for name in ("train", "val")}
    assert sorted(parts["train"] + parts["val"]) == sorted(ids)
    for name, members in parts.items():
        tasks = {sidecar(source)[ids[m]]["task"] for m in members}
        assert tasks == {"toy-point", "toy-noisy"}, (name, tasks)  # stratified: each task in each part
        assert [ids[m] for m in members] == sorted(ids[m] for m in members)  # dataset order within a part
        for new, member in enumerate(members):
            assert packet_hashes(tmp_path / "parts" / name, new) == packet_hashes(source, ids[member])
        assert violations(tmp_path / "parts" / name) == []
    same = edit_dataset(source, split=_split("train=0.5,val=0.5"), seed=3, stratify="task", out_root=tmp_path / "p2")
    assert [sidecar(tmp_path / "p2" / n) for n in ("train", "val")] == \
        [sidecar(tmp_path / "parts" / n) for n in ("train", "val")]
    rerun = edit_dataset(source, split=_split("train=0.5,val=0.5"), seed=3, stratify="task",
                         out_root=tmp_path / "parts")
    assert [o.status for o in rerun.outputs] == [ALREADY, ALREADY]
    # an export into a part adds nothing: the other part's episodes are recorded as removed
    assert export_stores([two_tasks["point"], two_tasks["noisy"]], tmp_path / "parts" / "train").exported == 0

    merged = merge_datasets([tmp_path / "parts" / "train", tmp_path / "parts" / "val"], tmp_path / "merged")
    (out,) = merged.outputs
    assert out.episodes == 8 and out.video_files_linked == 2 and out.video_files_copied == 0
    assert sorted((r["store_id"], r["staging_episode_id"]) for r in sidecar(tmp_path / "merged")) == sorted(ids)
    assert ExportMarker.read((tmp_path / "merged").resolve()).removed == ()
    assert violations(tmp_path / "merged", backends=("pyav", "torchcodec")) == []


def published_versions(dataset: Path) -> list[str]:
    return sorted(p.name for p in Path(f"{dataset}.versions").iterdir() if p.is_dir())


def _split(spec: str):
    from demoforge.storage.lerobot.edit_selection import parse_split

    return parse_split(spec)


def test_bad_input_is_exit_2_and_nothing_is_written(two_tasks, tmp_path, capsys):
    other = toy_store(tmp_path / "wide", 1, size=24)
    wide = tmp_path / "wide-dataset"
    export_stores([other], wide)
    dataset = copy_dataset(two_tasks["dataset"], tmp_path / "copy")
    before = tree(tmp_path)
    cases = [
        (["edit", str(dataset), "--delete", "2,9-12"], "no episode 9, 10, 11, 12 in the dataset"),
        (["edit", str(dataset), "--keep-where", 'length >= 10 and outcome = "success"'],
         "character 26: '=' is not an operator"),
        (["edit", str(dataset), "--keep-where", "(length > 3"], "expected ')'"),
        (["edit", str(dataset), "--split", "train=0.9,val=0.05,test=0.05", "--out-root", str(tmp_path / "s")],
         "part test would hold no episode (8 episode(s) to split)"),
        (["edit", str(dataset), "--delete", "0-"], "would leave no episode"),
        (["merge", str(dataset), str(wide), "--out", str(tmp_path / "m")],
         f"{CAM}: video (32, 32, 3) in {dataset}, video (24, 24, 3) in {wide}"),
        (["edit", str(dataset), "--task", "toy-nothing"], "no episode has that task"),
        # nesting is bounded before the parser recurses: no RecursionError (issue 57)
        (["edit", str(dataset), "--keep-where", "(" * 5000 + "success" + ")" * 5000],
         "character 51: nested more than 50 deep"),
        (["edit", str(dataset), "--keep-where", "not " * 5000 + "success"], "nested more than 50 deep"),
        (["edit", str(dataset), "--keep-where", "success or " * 10_000 + "success"], "at most 100000"),
    ]
    for argv, expected in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert expected in err, (argv, err)
        assert "Traceback" not in err
    assert tree(tmp_path) == before
    from demoforge.storage.lerobot.episode_filter import MAX_DEPTH, parse_filter

    assert parse_filter("(" * MAX_DEPTH + "success" + ")" * MAX_DEPTH)({"success": True})  # the bound itself is fine


def test_a_lerobot_dataset_is_smart_cut_and_the_reencoded_frames_are_reported(tmp_path, capsys):
    foreign = lerobot_written_dataset(tmp_path / "foreign", (9, 11, 7, 10), ("pick", "place"))
    continuous_reencode(foreign, g=4)  # episodes at frames 0, 9, 20, 27: 9 and 27 are not keyframes
    before = tree(foreign)
    assert main(["edit", str(foreign), "--delete", "0"]) == 2
    assert "demoforge did not write" in capsys.readouterr().err
    report = edit_dataset(foreign, delete="0", out=tmp_path / "edited")
    (out,) = report.outputs
    # episode 1 (frames 9-19) re-encodes 9-11 (up to the keyframe at 12); episode 3 (27-36) re-encodes 27
    assert (out.reencoded_frames, out.reencoded_episodes) == (4, 2)
    assert tree(foreign) == before
    edited = tmp_path / "edited"
    edit = ExportMarker.read(edited.resolve()).edit
    assert edit is not None and edit["reencoded_frames"] == 4  # recorded, never silent
    # Neither carries segment records and their features are the same: the source merges with its edit
    merged = tmp_path / "merged"
    assert main(["merge", str(foreign), str(edited), "--out", str(merged)]) == 0, capsys.readouterr().err
    assert violations(merged, demoforge=False) == [] and len(episodes_meta(merged)) == 7
    assert [len(episode_frames(merged, i)) for i in range(7)] == [9, 11, 7, 10, 11, 7, 10]
    assert violations(edited, demoforge=False, backends=("pyav", "torchcodec")) == []
    for new, old, head in ((0, 1, 3), (1, 2, 0), (2, 3, 1)):
        assert packet_hashes(edited, new)[head:] == packet_hashes(foreign, old)[head:]  # after the keyframe
        original, cut = episode_frames(foreign, old), episode_frames(edited, new)
        assert len(cut) == len(original)
        for t, (a, b) in enumerate(zip(original, cut)):
            if t >= head:
                np.testing.assert_array_equal(a, b)  # copied: the same pixels
            else:
                assert psnr(a, b) > 25, (new, t, psnr(a, b))  # re-encoded with the recorded settings
    # the result is a demoforge dataset: edited again in place (now every episode starts on a keyframe)
    again = edit_dataset(edited, delete="1")
    assert again.outputs[0].reencoded_frames == 0 and again.outputs[0].version == "v000002"
    assert violations(edited, demoforge=False) == []
    main(["edit", str(edited), "--delete", "0", "--dry-run"])
    assert "dry run: nothing was written" in capsys.readouterr().out


def test_viewer_marks_rejected_beside_the_dataset_and_edit_deletes_them(two_tasks, tmp_path):
    from demoforge.storage.lerobot.rejected import rejected_list_path
    from demoforge.pipeline.viewer.server import ViewerServer
    from demoforge.pipeline.viewer.source import open_source

    dataset = copy_dataset(two_tasks["dataset"], tmp_path)
    before = tree(dataset.resolve())
    source = open_source(dataset)
    server = ViewerServer(source, "127.0.0.1", 0).start()

    def post(body: dict, **headers: str) -> tuple[int, dict | None]:
        request = urllib.request.Request(server.url + "api/rejected", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(request) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, None

    try:
        assert post({"key": "2", "rejected": True}) == (200, {"keys": ["2"]})
        assert post({"key": "6", "rejected": True}, Origin=server.url.rstrip("/")) == (200, {"keys": ["2", "6"]})
        assert post({"key": "4", "rejected": True}, Origin="http://elsewhere.example")[0] == 403
        assert post({"key": "99", "rejected": True})[0] == 400
        assert post({"key": "4", "rejected": "yes"})[0] == 400
        page = urllib.request.urlopen(server.url + "data/rejected.js").read().decode()
        assert '"keys":["2","6"]' in page and '"writable":true' in page
        plain = urllib.request.Request(server.url + "api/rejected", data=b'{"key": "4", "rejected": true}',
                                       method="POST", headers={"Content-Type": "text/plain"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(plain)
        assert refused.value.code == 415
    finally:
        server.close()
        source.close()
    assert tree(dataset.resolve()) == before  # marking never writes the dataset
    listed = rejected_list_path(dataset)
    assert listed.parent == dataset.parent and listed.is_file()
    rejected_ids = [(sidecar(dataset)[i]["store_id"], sidecar(dataset)[i]["staging_episode_id"]) for i in (2, 6)]

    edit_dataset(dataset, delete="0")  # indices move: the list names episodes by their ids
    report = edit_dataset(dataset, delete_rejected=True)
    assert report.removed == {"rejected in the viewer": 2} and report.outputs[0].episodes == 5
    assert not set(rejected_ids) & {(r["store_id"], r["staging_episode_id"]) for r in sidecar(dataset)}
    assert not listed.exists()  # applied entries leave the list
    assert violations(dataset) == []
