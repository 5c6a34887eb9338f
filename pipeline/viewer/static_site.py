"""``demoforge view --html OUT_DIR``: the same page as a folder that opens from disk (file://), no server.

The folder mirrors the server's URL space (see ``pages``): the page, its assets, one data script per episode,
and the video files the episodes play (a dataset's mp4 files copied from the pinned version; a store's
streams remuxed; depth cameras' colour-mapped previews). It is built beside ``OUT_DIR`` and renamed into place, so a crash never leaves half a site.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from demoforge.pipeline.viewer.files import ViewerError
from demoforge.pipeline.viewer.pages import REJECTED_SCRIPT, data_script, episode_script_name, load_assets, \
    rejected_payload
from demoforge.pipeline.viewer.source import ViewerSource, each_episode, page_index

SITE_MARKER = ".demoforge-view.json"
COPY_CHUNK = 1 << 20


@dataclass(frozen=True)
class SiteReport:
    out: Path
    episodes: int
    videos: int  # video files copied or remuxed into the folder
    bytes: int  # the whole folder


def write_site(source: ViewerSource, out: Path | str,
               progress: Callable[[int, int], None] | None = None) -> SiteReport:
    out = Path(out)
    source_dir = Path(source.summary.location).resolve()
    for inside in (source_dir, source_dir.parent / f"{source_dir.name}.versions",
                   Path(source.summary.location).parent / f"{Path(source.summary.location).name}.versions"):
        if out.resolve().is_relative_to(inside.resolve()):
            raise ViewerError(f"{out} is inside the {source.summary.kind} it shows; the viewer never writes there "
                              "(choose a folder outside it)")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ViewerError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / SITE_MARKER).is_file():
        raise ViewerError(f"{out} is a non-empty directory not written by `demoforge view --html`; "
                          "refusing to write into it (choose a new directory)")
    build = out.parent / f".{out.name}.partial-{os.getpid()}"
    if build.exists():
        shutil.rmtree(build)
    try:
        written = _build(source, build, progress)
        (build / SITE_MARKER).write_text(json.dumps({"source": source.summary.location,
                                                     "version": source.summary.version}) + "\n")
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
            os.rename(build, out)
            shutil.rmtree(old)
        else:
            os.rename(build, out)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    videos = sum(1 for rel in written if rel.startswith(("files/", "media/")))
    return SiteReport(out, len(source.entries()), videos, sum(written.values()))


def _build(source: ViewerSource, build: Path, progress: Callable[[int, int], None] | None) -> dict[str, int]:
    written: dict[str, int] = {}

    def put(rel: str, data: bytes) -> None:
        path = build / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written[rel] = len(data)

    assets = load_assets()
    put("index.html", assets["index.html"])
    for name, data in assets.items():
        if name != "index.html":
            put(f"static/{name}", data)
    put("data/index.js", data_script("index", page_index(source)))
    put(f"data/{REJECTED_SCRIPT}", data_script("rejected", rejected_payload(source, writable=False)))
    for key, view in each_episode(source, progress):
        put(f"data/{episode_script_name(key)}", data_script(f"episode-{key}", view.to_json()))
        for video in view.videos:
            if video.url in written:
                continue
            parts = tuple(video.url.split("/"))
            if parts[0] == "files" and source.files is not None:
                written[video.url] = _copy_pinned(source, parts[1:], build / video.url)
            elif parts[0] == "media":
                stream = source.media(parts[1:])
                if stream is None:
                    raise ViewerError(f"episode {key}: no stream for {video.camera}")
                put(video.url, stream)
    return written


def _copy_pinned(source: ViewerSource, parts: tuple[str, ...], dest: Path) -> int:
    assert source.files is not None
    pinned = source.files.get(parts)
    if pinned is None:
        raise ViewerError(f"{'/'.join(parts)} is not a file of the dataset")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as f:
        offset = 0
        while offset < pinned.size:
            chunk = os.pread(pinned.fd, min(COPY_CHUNK, pinned.size - offset), offset)
            if not chunk:
                break
            f.write(chunk)
            offset += len(chunk)
    return offset
