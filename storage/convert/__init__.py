"""``demoforge convert``: a published LeRobot v3.0 dataset written in another format people train from.

Why a conversion of a published dataset rather than an ``export --format``: the v3.0 export is the one place
where episodes become data (atomic, checksummed, curated by ``edit``/``merge``), and every format's writer then
reads one thing, the dataset with its demoforge sidecar, whichever store, edit or merge made it. Each format is a
module with ``write(dataset, out) -> ConvertReport`` writing into ``out``, a fresh path this module chose; this
module refuses an output that overlaps the dataset or already exists, and publishes the result with one rename,
so a killed conversion leaves only a ``*.partial-*`` path that no reader takes for the format's own.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from demoforge.storage.convert.report import ConvertError, ConvertReport
from demoforge.storage.lerobot.output_guard import output_overlap
from demoforge.storage.lerobot.version_builder import PathBuilder
from demoforge.storage.paths import path_problem, short_path

__all__ = ["FORMATS", "ConvertError", "ConvertReport", "convert"]

#: format name -> (module writing it, whether its output is one file rather than a folder)
FORMATS: dict[str, tuple[str, bool]] = {
    "lerobot-v2.1": ("demoforge.storage.convert.lerobot_v21", False),
    "robomimic-hdf5": ("demoforge.storage.convert.robomimic_hdf5", True),
    "rlds": ("demoforge.storage.convert.rlds", False),
}

Writer = Callable[[Path, Path], ConvertReport]


def convert(dataset: Path | str, fmt: str, out: Path | str) -> ConvertReport:
    """Write the published dataset at ``dataset`` as ``fmt`` at ``out`` (which must not exist), atomically: built
    at a fresh path beside it and renamed into place (``storage/lerobot/version_builder.py`` ``PathBuilder``)."""
    dataset, out = Path(dataset), Path(out)
    if fmt not in FORMATS:
        raise ConvertError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    module_name, is_file = FORMATS[fmt]
    problem = path_problem(out, reserve=len(".partial-0000000000"))
    if problem:
        raise ConvertError(f"--out {short_path(out)}: the path {problem}")
    if not (dataset / "meta" / "info.json").is_file():
        raise ConvertError(f"{short_path(dataset)} is not a LeRobot v3.0 dataset (no meta/info.json)")
    version = _codebase_version(dataset)
    if version != "v3.0":
        raise ConvertError(f"{short_path(dataset)} is LeRobot {version}; convert reads a v3.0 dataset (an export, "
                           "edit or merge); nothing was written")
    overlap = output_overlap(out, {"the dataset": dataset})
    if overlap is not None:
        raise ConvertError(f"--out {overlap}: a conversion is written apart from its dataset; nothing was written")
    if out.exists() or out.is_symlink():
        raise ConvertError(f"--out {short_path(out)} exists: a conversion is written to a new path; nothing was "
                           "written")
    if not out.parent.is_dir():
        raise ConvertError(f"--out {short_path(out)}: its folder {short_path(out.parent)} does not exist")
    write = cast(Writer, getattr(importlib.import_module(module_name), "write"))
    partial = out.with_name(f"{out.name}.partial-{time.time_ns() % 10**10:010d}")
    started = time.perf_counter()
    with PathBuilder(out, partial) as built:
        report = write(dataset, partial)
        built.publish()
    return report.published(out, time.perf_counter() - started, is_file)


def _codebase_version(dataset: Path) -> str:
    """The dataset's ``codebase_version`` as the refusal names it (``format 'v2.1'``, or why it has none)."""
    try:
        info = json.loads((dataset / "meta" / "info.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"of unknown format (its meta/info.json cannot be read: {type(exc).__name__})"
    version = info.get("codebase_version") if isinstance(info, dict) else None
    return version if version == "v3.0" else f"format {version!r}"
