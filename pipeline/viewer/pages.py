"""The URL space of the viewer, shared by the server and the static site so both are the same page.

    index.html                      the page (static/index.html of this package)
    static/<asset>                  its script and style sheet
    data/index.js                   what was opened and the episode list
    data/rejected.js                the episodes marked rejected (a dataset's list file beside it), and whether
                                    the page may change it (served: yes; a static folder: no)
    api/rejected                    POST {"key", "rejected"}: mark or unmark one episode (served datasets only)
    data/episode-<key>.js           one episode: record, segments, curves, videos
    files/<path in the dataset>     a pinned file of the dataset version (videos)
    media/<episode key>/<camera>.mp4 a store's staged camera stream, remuxed; a depth camera's colour-mapped
                                    preview (stores and datasets)

Data comes as small scripts that call ``DemoforgeViewer.receive(name, payload)`` rather than as JSON: a page
opened from disk (file://) may load scripts but may not fetch files.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from demoforge.pipeline.viewer.source import EPISODE_KEY

ASSETS = ("index.html", "viewer.js", "viewer.css")
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".mp4": "video/mp4", ".json": "application/json",
                 ".jsonl": "application/x-ndjson", ".parquet": "application/vnd.apache.parquet",
                 ".png": "image/png"}


def load_assets() -> dict[str, bytes]:
    """The hand-written page, from the installed package (a wheel ships ``static/`` as package data)."""
    folder = resources.files("demoforge.pipeline.viewer") / "static"
    return {name: (folder / name).read_bytes() for name in ASSETS}


REJECTED_SCRIPT = "rejected.js"
REJECTED_API = "/api/rejected"


def rejected_payload(source: Any, *, writable: bool) -> dict[str, Any]:
    """What the page shows of the rejected list: the keys, whether it may change them, the file's name."""
    marks = source.rejections
    if marks is None:
        return {"keys": [], "writable": False, "file": None}
    return {"keys": marks.keys(), "writable": writable, "file": marks.path.name}


def data_script(name: str, payload: Any) -> bytes:
    body = json.dumps(payload, separators=(",", ":"), allow_nan=False, ensure_ascii=True)
    return f"window.DemoforgeViewer.receive({json.dumps(name)}, {body});\n".encode()


def episode_script_name(key: str) -> str:
    return f"episode-{key}.js"


def episode_key_of(script: str) -> str | None:
    """The episode key named by ``episode-<key>.js``, or None."""
    if not (script.startswith("episode-") and script.endswith(".js")):
        return None
    key = script[len("episode-"):-len(".js")]
    return key if EPISODE_KEY.fullmatch(key) else None


def content_type(name: str) -> str:
    dot = name.rfind(".")
    return CONTENT_TYPES.get(name[dot:] if dot >= 0 else "", "application/octet-stream")
