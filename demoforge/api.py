"""The library entry points behind ``from demoforge import generate, export, validate, open_dataset``
(``open_store`` is storage/store.py's own).

Each is the function the matching command calls, with keyword arguments instead of flags: a notebook or a
training script gets the same behaviour (resume, atomic publishing, checks) as the command line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from demoforge.pipeline.runner import JobReport
    from demoforge.storage.lerobot.export import ExportReport
    from demoforge.storage.lerobot.validate import ValidationReport


def generate(task: str, episodes: int, store: Path | str, *, options: Mapping[str, Any] | None = None,
             seed: int = 0, max_attempts: int = 3, workers: int = 1, num_envs: int = 1,
             codec: str = "libsvtav1") -> JobReport:
    """Run ``task`` until ``episodes`` are committed in ``store``; calling it again resumes the same job."""
    from demoforge.pipeline.job import JobSpec, VideoSettings
    from demoforge.pipeline.runner import run_job

    spec = JobSpec(task=task, episodes=episodes, task_options=dict(options or {}), seed=seed,
                   max_attempts=max_attempts, workers=workers, num_envs=num_envs, video=VideoSettings(codec=codec))
    return run_job(spec, store)


def export(store: Path | str | Sequence[Path | str], out: Path | str, *, repo_id: str | None = None) -> ExportReport:
    """Publish the committed, not yet exported episodes of ``store`` (or of several stores with the same
    features, in order) as a new version of the dataset ``out``."""
    from demoforge.storage.lerobot.export import export_stores

    stores = [store] if isinstance(store, (str, Path)) else list(store)
    return export_stores(stores, out, repo_id=repo_id)


def validate(dataset: Path | str, *, expect_segments: int | None = None, video_backend: str = "pyav") -> ValidationReport:
    """Check a dataset's structure and sidecar and load it with ``LeRobotDataset``; ``report.ok`` says."""
    from demoforge.storage.lerobot.validate import validate_dataset

    return validate_dataset(dataset, expect_segments=expect_segments, video_backend=video_backend)


def open_dataset(dataset: Path | str, **kwargs: Any) -> LeRobotDataset:
    """The exported dataset as LeRobot's own ``LeRobotDataset`` (local files only; nothing is downloaded).

    Keyword arguments go to ``LeRobotDataset`` (``delta_timestamps``, ``video_backend``, ``episodes``...)."""
    import json

    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from demoforge.storage.lerobot.export import MARKER

    root = Path(dataset)
    marker = root / MARKER
    repo_id = json.loads(marker.read_text()).get("repo_id") if marker.is_file() else None
    return LeRobotDataset(repo_id or "local/dataset", root=root, **kwargs)

