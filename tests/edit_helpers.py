"""Helpers of the `demoforge edit` / `merge` tests: datasets to edit, copies of them, packets by episode, and the
checks every edited dataset must pass."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq

from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.storage.lerobot.file_checksums import verify_dataset
from demoforge.storage.lerobot.validate import validate_dataset

CAM = "observation.images.cam"


def lerobot_written_dataset(root: Path, lengths: tuple[int, ...] = (9, 11, 7),
                            tasks: tuple[str, ...] = ("pick",)) -> Path:
    """Episodes of ``lengths`` frames written by LeRobot's own recorder at 10 fps (h264, a keyframe every 4
    frames), a 2-d state and action and one 32x32 camera ``CAM`` whose every frame differs; episode i's task is
    ``tasks[i % len(tasks)]``."""
    from lerobot.configs import RGBEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {"observation.state": {"dtype": "float32", "shape": (2,), "names": None},
                "action": {"dtype": "float32", "shape": (2,), "names": None},
                CAM: {"dtype": "video", "shape": (32, 32, 3), "names": ["height", "width", "channels"]}}
    dataset = LeRobotDataset.create("local/foreign", fps=10, features=features, root=root, use_videos=True,
                                    rgb_encoder=RGBEncoderConfig(vcodec="h264", g=4,
                                                                 extra_options={"sc_threshold": "0"}))
    rng = np.random.default_rng(0)
    g = 0
    for episode, length in enumerate(lengths):
        for _ in range(length):
            image = np.zeros((32, 32, 3), np.uint8)
            image[:, :, 0], image[:, :, 1], image[g % 32, :, 2] = (g * 7) % 256, 100, 255
            g += 1
            dataset.add_frame({"observation.state": rng.random(2, dtype=np.float32),
                               "action": rng.random(2, dtype=np.float32), CAM: image,
                               "task": tasks[episode % len(tasks)]})
        dataset.save_episode()
    dataset.finalize()
    return root


def toy_store(store: Path, episodes: int, task: str = "toy-point", steps: int = 20, size: int = 32,
              codec: str = "h264") -> Path:
    report = run_job(JobSpec(task=task, episodes=episodes, task_options={"steps": steps, "size": size},
                             video=VideoSettings(codec=codec)), store)
    assert report.complete
    return store


def copy_dataset(link: Path, dest: Path) -> Path:
    """A copy of a published dataset (its link and its versions folder) under ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(f"{link}.versions", dest / f"{link.name}.versions", symlinks=True)
    os.symlink(os.readlink(link), dest / link.name)
    return dest / link.name


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (links not followed) and what it holds: to show that nothing was written."""
    out = {}
    for dirpath, dirs, names in os.walk(root):
        for name in names + [d for d in dirs if (Path(dirpath) / d).is_symlink()]:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            out[rel] = f"-> {os.readlink(path)}" if path.is_symlink() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def episodes_meta(dataset: Path) -> list[dict]:
    root = dataset.resolve()
    rows = [r for f in sorted(root.glob("meta/episodes/*/*.parquet")) for r in pq.read_table(f).to_pylist()]
    return sorted(rows, key=lambda r: r["episode_index"])


def sidecar(dataset: Path) -> list[dict]:
    path = dataset.resolve() / "meta" / "demoforge_episodes.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def packet_hashes(dataset: Path, index: int, key: str = CAM) -> list[str]:
    """sha256 of each packet of one episode's span of its camera file, in decode order."""
    root = dataset.resolve()
    info = json.loads((root / "meta" / "info.json").read_text())
    row = episodes_meta(dataset)[index]
    path = root / info["video_path"].format(video_key=key, chunk_index=row[f"videos/{key}/chunk_index"],
                                            file_index=row[f"videos/{key}/file_index"])
    start, end, fps = row[f"videos/{key}/from_timestamp"], row[f"videos/{key}/to_timestamp"], info["fps"]
    with av.open(str(path), mode="r") as container:
        stream = container.streams.video[0]
        assert stream.time_base is not None, f"{path}: a video stream without a time base"
        tb = Fraction(stream.time_base)
        hashes = [hashlib.sha256(bytes(p)).hexdigest() for p in container.demux(stream)
                  if p.size and p.pts is not None and start - 0.5 / fps <= float(p.pts * tb) < end - 0.5 / fps]
    return hashes


def episode_frames(dataset: Path, index: int, key: str = CAM) -> list[np.ndarray]:
    from demoforge.storage.video import decode_span

    root = dataset.resolve()
    info = json.loads((root / "meta" / "info.json").read_text())
    row = episodes_meta(dataset)[index]
    path = root / info["video_path"].format(video_key=key, chunk_index=row[f"videos/{key}/chunk_index"],
                                            file_index=row[f"videos/{key}/file_index"])
    return decode_span(path, row[f"videos/{key}/from_timestamp"], row[f"videos/{key}/to_timestamp"], info["fps"])


def data_rows(dataset: Path, index: int) -> dict[str, list]:
    """One episode's rows without the columns an edit renumbers."""
    root = dataset.resolve()
    table = pq.read_table(sorted(root.glob("data/*/*.parquet")))
    rows = table.filter(np.asarray(table["episode_index"].to_numpy()) == index).to_pydict()
    return {k: v for k, v in rows.items() if k not in ("episode_index", "index", "task_index")}


def violations(dataset: Path, *, demoforge: bool = True, backends: tuple[str, ...] = ("pyav",)) -> list[str]:
    """What is wrong with a published dataset: checksums (`demoforge verify`), `demoforge validate` (demoforge
    datasets), LeRobotDataset loads with each backend and reads every frame count right."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    problems = [f"verify: {p.path}: {p.problem}" for p in verify_dataset(dataset).problems]
    if demoforge:
        for backend in backends:
            report = validate_dataset(dataset, video_backend=backend)
            problems += [f"validate ({backend}): {p}" for p in report.problems]
            if report.load_error:
                problems.append(f"validate ({backend}): {report.load_error}")
    else:
        for backend in backends:
            ds = LeRobotDataset("local/edited", root=dataset, video_backend=backend)
            lengths = [int(e["length"]) for e in ds.meta.episodes]
            if len(ds) != sum(lengths):
                problems.append(f"{backend}: {len(ds)} frames, episodes say {sum(lengths)}")
            for first in np.cumsum([0, *lengths[:-1]]):
                item = ds[int(first)]
                if tuple(item[CAM].shape)[0] != 3:
                    problems.append(f"{backend}: frame {first} decoded as {tuple(item[CAM].shape)}")
    return problems


def continuous_reencode(dataset: Path, g: int = 4) -> None:
    """Re-encode a LeRobot dataset's camera file as ONE stream (keyframes every ``g`` frames, wherever the
    episodes start), with the settings its info.json records: what a dataset re-encoded by a tool that does not
    keep episode boundaries (a conversion, an external re-encode) looks like. The metadata stays true: same
    frames, same times."""
    root = dataset.resolve()
    info = json.loads((root / "meta" / "info.json").read_text())
    video = info["features"][CAM]["info"]
    for path in sorted(root.glob(f"videos/{CAM}/*/*.mp4")):
        with av.open(str(path)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])]
        buffer = io.BytesIO()
        with av.open(buffer, "w", format="mp4") as out:
            stream = out.add_stream(video["video.codec"], rate=info["fps"],
                                    options={"g": str(g), "crf": str(video["video.crf"]),
                                             **{k: str(v) for k, v in video["video.extra_options"].items()}})
            stream.height, stream.width = frames[0].shape[:2]
            stream.pix_fmt = video["video.pix_fmt"]
            for i, image in enumerate(frames):
                frame = av.VideoFrame.from_ndarray(image, format="rgb24")
                frame.pts = i
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
        path.write_bytes(buffer.getvalue())
