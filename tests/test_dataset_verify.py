"""`demoforge verify DATASET`: published files are checked against the checksums the export recorded."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import run_cli


def test_verify_dataset_reports_changed_missing_and_extra_files(tmp_path: Path) -> None:
    store, dataset = tmp_path / "store", tmp_path / "dataset"
    made = run_cli("generate", "--task", "toy-point", "--codec", "h264", "--option", "steps=8", "--episodes", "2",
                   "--store", str(store), "--export", str(dataset))
    assert made.returncode == 0, made.stderr
    more = run_cli("generate", "--task", "toy-point", "--codec", "h264", "--option", "steps=8", "--episodes", "3",
                   "--store", str(store), "--export", str(dataset))  # a second version: hard-linked files too
    assert more.returncode == 0, more.stderr
    good = run_cli("verify", str(dataset), "--json")
    assert good.returncode == 0, good.stdout + good.stderr
    report = json.loads(good.stdout)
    assert report["ok"] and report["version"] == "v000002" and report["checked"] >= 8
    assert report["decoded_frames"] >= 3

    current = dataset.resolve()
    parquet = sorted(current.glob("data/**/*.parquet"))[0]
    video = sorted(current.glob("videos/**/*.mp4"))[-1]
    for path in (parquet, video):  # a flipped byte, written without touching the other version's hard link
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.unlink()
        path.write_bytes(bytes(data))
    info = current / "meta" / "info.json"
    info.unlink()
    (current / "meta" / "notes.txt").write_text("added by hand")

    bad = run_cli("verify", str(dataset))
    assert bad.returncode == 1
    lines = bad.stdout.splitlines()
    for path, problem in ((parquet, "changed: sha256 differs"), (video, "changed: sha256 differs"),
                          (info, "missing"), (current / "meta" / "notes.txt", "extra")):
        rel = path.relative_to(current)
        assert any(f"{dataset / rel}: {problem}" in line for line in lines), (rel, bad.stdout)
    assert "Traceback" not in bad.stderr

    neither = run_cli("verify")
    assert neither.returncode != 0 and "one of them" in neither.stderr
