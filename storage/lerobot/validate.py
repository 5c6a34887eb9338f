"""Structural checks of a LeRobot v3.0 dataset, then a load through the real ``LeRobotDataset``; and, apart,
demoforge's annotations when the dataset has them.

Two questions, answered separately: is it a valid LeRobot v3.0 dataset (counts, indices, timestamps, episode
metadata against the data, every video file holding its episodes' frames, finite statistics, no episode twice,
LeRobot loads it and decodes sampled frames), and, when it carries demoforge's annotations (the
``annotation.*`` columns and ``meta/demoforge_episodes.jsonl``), do they agree with it. A dataset without them (one
LeRobot's writer made, or ``demoforge repair`` rebuilt from one) is valid when the first answer is yes; a line says
the annotations are absent, and ``--expect-segments`` makes their absence a mismatch.

Exit codes of ``demoforge validate``: 0 valid, 1 a mismatch was found, 2 the dataset cannot be loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np

from demoforge.storage.lerobot.format import INFO, SIDECAR, STATS, VIDEO_PATH, read_sidecar
from demoforge.storage.schema import ANNOTATION_KEYS
from demoforge.storage.video import count_frames

VALID, MISMATCH, UNLOADABLE = 0, 1, 2
STATUS_WORDS = ("valid", "mismatch", "cannot load")
CHECKED, ABSENT = "checked", "absent"


@dataclass
class ValidationReport:
    dataset: str
    episodes: int = 0
    frames: int = 0
    checks: dict[str, int] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    load_error: str | None = None
    decoded_frames: int = 0
    annotations: str = ABSENT  # demoforge's annotations: CHECKED, or ABSENT (not checked)
    annotation_problems: int = 0  # of ``problems``, those about demoforge's annotations
    notes: list[str] = field(default_factory=list)  # true and worth saying, not a mismatch
    _annotating: bool = field(default=False, repr=False)

    @property
    def status(self) -> int:
        if self.load_error:
            return UNLOADABLE
        return MISMATCH if self.problems else VALID

    @property
    def lerobot_status(self) -> int:
        """The status as a LeRobot v3.0 dataset alone (demoforge's annotations left out)."""
        if self.load_error:
            return UNLOADABLE
        return MISMATCH if len(self.problems) > self.annotation_problems else VALID

    def problem(self, text: str, *, annotation: bool = False) -> None:
        if len(self.problems) < 200:
            self.problems.append(text)
            self.annotation_problems += int(annotation or self._annotating)

    @contextlib.contextmanager
    def annotating(self) -> Iterator[None]:
        """The problems found inside are about demoforge's annotations."""
        self._annotating = True
        try:
            yield
        finally:
            self._annotating = False

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "status": STATUS_WORDS[self.status],
                "lerobot_v3": STATUS_WORDS[self.lerobot_status], "demoforge_annotations": self.annotations,
                "episodes": self.episodes, "frames": self.frames, "checks": dict(self.checks),
                "decoded_frames": self.decoded_frames, "problems": self.problems, "notes": self.notes,
                "load_error": self.load_error}


def _read_table(root: Path, pattern: str):
    import pyarrow.parquet as pq

    import pyarrow as pa

    files = sorted(root.glob(pattern))
    if not files:
        raise FileNotFoundError(f"no files match {pattern}")
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")


def validate_dataset(root: Path | str, *, expect_segments: int | None = None, video_backend: str = "pyav",
                     sample_frames: int = 8, seed: int = 0) -> ValidationReport:
    root = Path(root)
    report = ValidationReport(dataset=str(root))
    try:
        info = json.loads((root / INFO).read_text())
        data = _read_table(root, "data/*/*.parquet").to_pandas()
        episodes = _read_table(root, "meta/episodes/*/*.parquet").to_pandas()
    except Exception as exc:  # unreadable files are "cannot load"
        report.load_error = f"{type(exc).__name__}: {exc}"
        return report
    fps = int(info["fps"])
    report.episodes, report.frames = len(episodes), len(data)
    annotated = any(f"annotation.{k}" in data for k in ANNOTATION_KEYS) or (root / SIDECAR).exists()
    report.annotations = CHECKED if annotated else ABSENT
    _check_structure(report, info, data, episodes, fps, expect_segments if annotated else None)
    if annotated:
        with report.annotating():
            _check_sidecar(report, root, data, episodes, fps)
    elif expect_segments is not None:
        report.problem(f"--expect-segments {expect_segments}: the dataset has no segment annotations (not a "
                       "demoforge export, or one rebuilt without them)", annotation=True)
    _check_statistics(report, root, episodes)
    _check_duplicates(report, root, info, data, episodes)
    _check_videos(report, root, info, episodes, fps)
    _check_load(report, root, video_backend, sample_frames, seed)
    return report


def _check_structure(report: ValidationReport, info: dict, data, episodes, fps: int,
                     expect_segments: int | None) -> None:
    if info.get("total_episodes") != len(episodes) or info.get("total_frames") != len(data):
        report.problem(f"info.json counts {info.get('total_episodes')} episodes / {info.get('total_frames')} "
                       f"frames; the files hold {len(episodes)} / {len(data)}")
    report.checks["totals"] += 1
    if list(data["index"]) != list(range(len(data))):
        report.problem("the global frame index is not 0..N-1 in order")
    if sorted(episodes["episode_index"]) != list(range(len(episodes))):
        report.problem("episode indices are not contiguous from 0")
    report.checks["indices"] += 1
    by_episode = data.groupby("episode_index", sort=True)
    for row in episodes.itertuples(index=False):
        ep = int(row.episode_index)
        if ep not in by_episode.groups:
            report.problem(f"episode {ep}: no frames in data")
            continue
        frames = by_episode.get_group(ep)
        n = len(frames)
        if n != row.length or int(frames["index"].iloc[0]) != row.dataset_from_index or \
                int(frames["index"].iloc[-1]) + 1 != row.dataset_to_index:
            report.problem(f"episode {ep}: metadata says {row.length} frames [{row.dataset_from_index}, "
                           f"{row.dataset_to_index}), data has {n}")
        if list(frames["frame_index"]) != list(range(n)):
            report.problem(f"episode {ep}: frame_index is not 0..{n - 1}")
        expected_ts = (np.arange(n) / fps).astype(np.float32)
        if not np.allclose(frames["timestamp"].to_numpy(np.float32), expected_ts, atol=1e-4):
            report.problem(f"episode {ep}: timestamps are not frame_index / fps")
        missing = [f"annotation.{k}" for k in ANNOTATION_KEYS if f"annotation.{k}" not in frames]
        if report.annotations == ABSENT:
            pass
        elif missing:
            if ep == 0:
                report.problem(f"demoforge's segment annotations are incomplete: missing {', '.join(missing)}",
                               annotation=True)
        else:
            with report.annotating():
                _check_annotations(report, ep, frames, expect_segments)
        report.checks["episodes"] += 1


def _check_annotations(report: ValidationReport, ep: int, frames, expect_segments: int | None) -> None:
    seg = frames["annotation.segment_id"].to_numpy()
    start = frames["annotation.segment_start"].to_numpy()
    end = frames["annotation.segment_end"].to_numpy()
    if list(frames["annotation.episode_step"]) != list(range(len(frames))):
        report.problem(f"episode {ep}: annotation.episode_step is not 0..{len(frames) - 1}")
    if seg[0] != 0 or not set(np.diff(seg)) <= {0, 1}:
        report.problem(f"episode {ep}: segment ids are not contiguous from 0")
    for sid in np.unique(seg):
        rows = np.flatnonzero(seg == sid)
        if start[rows].sum() != 1 or start[rows[0]] != 1 or end[rows].sum() != 1 or end[rows[-1]] != 1:
            report.problem(f"episode {ep}: segment {sid} lacks exactly one start flag on its first frame and "
                           "one end flag on its last")
    if expect_segments is not None and len(np.unique(seg)) != expect_segments:
        report.problem(f"episode {ep}: {len(np.unique(seg))} segments, expected {expect_segments}")
    for flag in ("annotation.terminated", "annotation.truncated"):
        values = frames[flag].to_numpy()
        if values[:-1].any():
            report.problem(f"episode {ep}: {flag} set before the last frame")
    # A success ends terminated; a kept policy failure (stages/contract.py) may end truncated instead.
    if frames["annotation.terminated"].to_numpy()[-1] != 1 and frames["annotation.truncated"].to_numpy()[-1] != 1:
        report.problem(f"episode {ep}: the last frame is marked neither terminated nor truncated")
    report.checks["annotations"] += 1


def _check_sidecar(report: ValidationReport, root: Path, data, episodes, fps: int) -> None:
    path = root / SIDECAR
    if not path.exists():
        report.problem(f"{SIDECAR} is missing")
        return
    records = read_sidecar(root)
    by_index = {r["dataset_episode_index"]: r for r in records}
    if sorted(by_index) != sorted(int(e) for e in episodes["episode_index"]) or len(records) != len(episodes):
        report.problem(f"the sidecar lists {len(records)} episodes, the dataset holds {len(episodes)}")
        return
    lengths = dict(zip(episodes["episode_index"], episodes["length"]))
    grouped = data.groupby("episode_index")
    for index, record in by_index.items():
        if record["length"] != lengths[index]:
            report.problem(f"episode {index}: sidecar length {record['length']} != data {lengths[index]}")
            continue
        if "annotation.segment_id" in data:
            seg = grouped.get_group(index)["annotation.segment_id"].to_numpy()
            for s in record.get("segments", []):
                span = np.flatnonzero(seg == s["segment_id"])
                if len(span) == 0 or (span[0], span[-1] + 1) != (s["start_step"], s["end_step"]):
                    report.problem(f"episode {index}: sidecar segment {s['name']!r} span "
                                   f"[{s['start_step']}, {s['end_step']}) disagrees with the annotations")
    report.checks["sidecar"] += 1


def _check_videos(report: ValidationReport, root: Path, info: dict, episodes, fps: int) -> None:
    for key, ft in info["features"].items():
        if ft.get("dtype") != "video":
            continue
        files: dict[tuple[int, int], int] = Counter()
        for row in episodes.to_dict("records"):
            chunk, file = int(row[f"videos/{key}/chunk_index"]), int(row[f"videos/{key}/file_index"])
            span = row[f"videos/{key}/to_timestamp"] - row[f"videos/{key}/from_timestamp"]
            if abs(span * fps - row["length"]) > 1e-3:
                report.problem(f"episode {row['episode_index']}: {key} spans {span:.4f} s for {row['length']} frames")
            files[(chunk, file)] += int(row["length"])
        for (chunk, file), expected in files.items():
            path = root / VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file)
            try:
                count = count_frames(path)
            except (FileNotFoundError, av.FFmpegError) as exc:
                report.problem(f"{path.relative_to(root)}: cannot read: {exc}")
                continue
            if count < expected:
                report.problem(f"{path.relative_to(root)} holds {count} frames; its episodes need {expected}")
            elif count > expected:  # LeRobot reads by timestamp: frames no episode uses are never decoded
                report.notes.append(f"{path.relative_to(root)} holds {count} frames, its episodes use {expected} (the "
                                    "others, e.g. of an episode a repair dropped, are never read)")
            report.checks["video_files"] += 1
            if (ft.get("info") or {}).get("is_depth_map"):
                _check_depth_stream(report, root, key, ft, path)


#: What LeRobot 0.6.1 needs to read a depth video back to metres (``DepthEncoderConfig.from_video_info``).
DEPTH_INFO_KEYS = ("depth_unit", "video.codec", "video.pix_fmt", "video.depth_min", "video.depth_max",
                   "video.shift", "video.use_log")
DEPTH_QMAX = 4095  # lerobot.configs.video.DEPTH_QMAX: 12-bit codes


def _check_depth_stream(report: ValidationReport, root: Path, key: str, ft: dict, path: Path) -> None:
    """A depth feature's codec fields agree with its file, and its first frame decodes to 12-bit codes."""
    info = ft["info"]
    where = path.relative_to(root)
    missing = [k for k in DEPTH_INFO_KEYS if info.get(k) is None]
    if missing:
        report.problem(f"{key}: depth feature info lacks {', '.join(missing)}")
        return
    height, width = int(info.get("video.height", 0)), int(info.get("video.width", 0))
    if list(ft.get("shape", [])) != [height, width, 1] or info.get("video.channels") != 1:
        report.problem(f"{key}: a depth feature must have shape [H, W, 1] and 1 channel; info says shape "
                       f"{ft.get('shape')}, {info.get('video.channels')} channel(s)")
    if info["depth_unit"] not in ("m", "mm"):
        report.problem(f"{key}: depth_unit {info['depth_unit']!r} is neither 'm' nor 'mm'")
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            codec, pix_fmt = stream.codec_context.name, stream.codec_context.pix_fmt
            frame = next(container.decode(stream), None)
            codes = None if frame is None else frame.to_ndarray(format=info["video.pix_fmt"])
    except (av.FFmpegError, ValueError) as exc:
        report.problem(f"{where}: cannot decode the depth stream: {exc}")
        return
    if codec != info["video.codec"] or pix_fmt != info["video.pix_fmt"]:
        report.problem(f"{where}: the stream is {codec} {pix_fmt}; {key}'s info says {info['video.codec']} "
                       f"{info['video.pix_fmt']}")
    if codes is None or codes.shape != (height, width) or int(codes.max()) > DEPTH_QMAX:
        report.problem(f"{where}: the first depth frame decodes to "
                       f"{None if codes is None else (codes.shape, int(codes.max()))}; expected ({height}, {width}) "
                       f"codes <= {DEPTH_QMAX}")
    report.checks["depth_streams"] += 1


def _check_load(report: ValidationReport, root: Path, backend: str, samples: int, seed: int) -> None:
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        dataset = LeRobotDataset(repo_id=f"local/{root.name}", root=root, video_backend=backend,
                                 depth_output_unit="m")
        if len(dataset) != report.frames:
            report.problem(f"LeRobotDataset sees {len(dataset)} frames, the files hold {report.frames}")
        rng = random.Random(seed)
        picks = sorted(rng.sample(range(len(dataset)), min(samples, len(dataset)))) if len(dataset) else []
        for i in picks:
            item = dataset[i]
            for key in dataset.meta.video_keys:
                if tuple(item[key].shape) != tuple(np.roll(dataset.meta.features[key]["shape"], 1)):
                    report.problem(f"frame {i}: {key} decoded as {tuple(item[key].shape)}")
                if key in dataset.meta.depth_keys:
                    info = dataset.meta.features[key]["info"]
                    metres = item[key].numpy()
                    low, high = float(info["video.depth_min"]), float(info["video.depth_max"])
                    if not np.isfinite(metres).all() or metres.min() < low - 1e-6 or metres.max() > high + 1e-6:
                        report.problem(f"frame {i}: {key} decoded to {metres.min():.4g}..{metres.max():.4g} m, "
                                       f"outside the quantizer's range {low:g}..{high:g} m")
                report.decoded_frames += 1
    except Exception as exc:
        report.load_error = f"{type(exc).__name__}: {exc}"


def _check_statistics(report: ValidationReport, root: Path, episodes) -> None:
    """Every statistic finite: in meta/stats.json and in each episode's row (a NaN std trains nothing)."""
    try:
        stats = json.loads((root / STATS).read_text())
    except FileNotFoundError:
        report.problem(f"{STATS} is missing")
        return
    except (OSError, ValueError) as exc:
        report.problem(f"{STATS} does not read: {exc}")
        return
    bad = [f"{feature} {name} ({_first_bad(value)})" for feature, per in (stats.items() if isinstance(stats, dict)
                                                                          else ())
           if isinstance(per, dict) for name, value in per.items() if _first_bad(value) is not None]
    if bad:
        report.problem(f"{STATS}: statistics that are not finite numbers: {', '.join(bad[:10])}"
                       + (f" and {len(bad) - 10} more" if len(bad) > 10 else ""))
    for column in [c for c in episodes.columns if str(c).startswith("stats/")]:
        for row, value in zip(episodes["episode_index"], episodes[column]):
            why = _first_bad(value)
            if why is not None:
                report.problem(f"episode {int(row)}: meta/episodes {column} is not finite ({why})")
                break
    report.checks["statistics"] += 1


def _first_bad(value: Any) -> str | None:
    """The first value in a (nested) statistic that is not a finite number, as text; None if all are."""
    if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.dtype == object):
        return next((why for v in value if (why := _first_bad(v)) is not None), None)
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return repr(value)[:40]
    return None if np.isfinite(array).all() else str(array[~np.isfinite(array)].reshape(-1)[0])


def _episode_digest(frames, video_keys: list[str], meta_row: dict[str, Any]) -> str:
    """What an episode is, for finding one held twice: every recorded column but the dataset's own numbering,
    and each camera's statistics (a re-rendered look of the same motion is another episode)."""
    digest = hashlib.sha256()
    for column in frames.columns:
        if column in ("episode_index", "index", "task_index"):
            continue
        values = frames[column].to_numpy()
        try:
            digest.update(np.stack([np.asarray(v, dtype=np.float64) for v in values]).tobytes())
        except (TypeError, ValueError):
            digest.update(repr(values.tolist()).encode())
    for key in video_keys:
        digest.update(repr(meta_row.get(f"stats/{key}/mean")).encode())
    return digest.hexdigest()


def _check_duplicates(report: ValidationReport, root: Path, info: dict, data, episodes) -> None:
    """No episode twice: the same rows and the same look (its cameras' statistics) under two indices, from the
    same seed where demoforge's records name it (a task may make two seeds' episodes alike), or one staging
    episode of one store listed twice in those records."""
    video_keys = [k for k, ft in info.get("features", {}).items() if ft.get("dtype") == "video"]
    meta = {int(r["episode_index"]): r for r in episodes.to_dict("records")}
    try:
        records = {int(r["dataset_episode_index"]): r for r in read_sidecar(root)}
    except (OSError, ValueError, KeyError, TypeError):
        records = {}
    seen: dict[str, int] = {}
    staged: dict[tuple[Any, Any], int] = {}
    for ep, frames in data.groupby("episode_index", sort=True):
        index, record = int(ep), records.get(int(ep), {})
        key = _episode_digest(frames, video_keys, meta.get(index, {})) + f"|seed={record.get('seed')}"
        origin = (record.get("store_id"), record.get("staging_episode_id"))
        if key in seen:
            report.problem(f"episode {index} is episode {seen[key]} again (the same rows and camera statistics"
                           + (", from the same seed)" if "seed" in record else ")"))
        elif origin[1] is not None and origin in staged:
            report.problem(f"episode {index} is episode {staged[origin]} again (both are staging episode "
                           f"{origin[1]} of store {origin[0]})")
        seen.setdefault(key, index)
        if origin[1] is not None:
            staged.setdefault(origin, index)
    report.checks["duplicates"] += 1


def describe(report: ValidationReport) -> str:
    lines = [f"{report.dataset}: {report.episodes} episodes, {report.frames} frames; "
             f"checks run: {', '.join(f'{k}={v}' for k, v in sorted(report.checks.items()))}; "
             f"decoded {report.decoded_frames} sampled camera frames"]
    if report.load_error:
        lines.append(f"CANNOT LOAD: {report.load_error}")
    lines += [f"MISMATCH: {p}" for p in report.problems]
    lines += [f"note: {n}" for n in report.notes]
    lerobot = len(report.problems) - report.annotation_problems
    lines.append("as a LeRobot v3.0 dataset: "
                 + ["valid", f"{lerobot} mismatch(es)", "cannot load"][report.lerobot_status])
    lines.append("demoforge's annotations: " + (
        f"{report.annotation_problems} mismatch(es)" if report.annotation_problems else
        "checked, they agree with the data" if report.annotations == CHECKED else
        "absent (segment columns, meta/demoforge_episodes.jsonl): not a demoforge export, not checked"))
    lines.append(["valid", f"{len(report.problems)} mismatch(es)", "cannot load"][report.status])
    return "\n".join(lines)
