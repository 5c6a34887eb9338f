"""The store's read side and persistent schema: a reader cannot write, stored records are typed and refuse
old or foreign data by name, and the online sampler works without torch."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

import toy_tasks  # noqa: F401
from helpers import read_row
from demoforge.pipeline.job import JobSpec, VideoSettings
from demoforge.pipeline.runner import run_job
from demoforge.storage.catalog import Catalog
from demoforge.storage.paths import CATALOG_FILE
from demoforge.storage.errors import ReadOnlyError, StoreError
from demoforge.storage.lerobot.format import ExportMarker, MarkerError
from demoforge.storage.lerobot.publish import NotOurDatasetError, resolve_target
from demoforge.storage.store import open_store
from demoforge.storage.schema import AttemptState, CameraSpec, Fingerprint, FingerprintError
from helpers import REPO, cli_env, run_cli

SPEC = JobSpec(task="toy-point", episodes=2, task_options={"steps": 12, "size": 16}, video=VideoSettings(codec="h264"))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "store"
    run_job(SPEC, path)
    return path


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("module", ["demoforge.storage.sampling.online", "demoforge.storage.sampling"])
def test_the_online_sampler_does_not_import_torch(module):
    code = f"import {module}, sys; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    done = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_reader_refuses_every_write_and_changes_nothing(store):
    before = digest(store / CATALOG_FILE)
    with open_store(store) as view:
        assert view.read_only and view.fingerprint == SPEC.fingerprint()
        rows = view.committed()
        assert [r.state for r in rows] == [AttemptState.COMMITTED] * 2
        staging = view.staging
        assert staging is not None
        catalog = Catalog.open_read_only(store)  # what a reader's store holds: the catalog itself refuses too
        writes = [lambda: view.quarantine(rows[0].episode_id, "x"),
                  lambda: view.mark_exported({rows[0].episode_id: 0}),
                  lambda: catalog.begin_attempt(9, 0, "ep00000009-a00", 1),
                  lambda: catalog.bind_job(SPEC.fingerprint()),
                  lambda: catalog.log_recovery("x", "y"),
                  lambda: staging.delete_episode(rows[0].episode_id),
                  lambda: staging.open_episode("ep00000009-a00")]
        for write in writes:
            with pytest.raises(ReadOnlyError, match=f"cannot .* {store}.* is open read-only") as info:
                write()
            assert isinstance(info.value, StoreError)
        catalog.close()
        assert read_row(staging, rows[0]).action.shape[0] == 12
    assert digest(store / CATALOG_FILE) == before
    assert [r.state for r in open_store(store, "r+").committed()] == [AttemptState.COMMITTED] * 2


def test_reading_an_unfinished_store_adds_no_schema(tmp_path):
    """A run killed before it wrote the schema leaves an empty catalog: readers see an empty store, and the
    file stays as it was (the old read path added tables to it)."""
    (tmp_path / CATALOG_FILE).write_bytes(b"")
    with open_store(tmp_path) as view:
        assert view.fingerprint is None and view.staging is None and view.committed() == []
        assert view.summary()["committed_frames"] == 0
        with pytest.raises(StoreError, match="holds no job yet"):
            view.require_job()
    status = run_cli("status", "--store", str(tmp_path), "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["attempts_by_state"] == {}
    assert (tmp_path / CATALOG_FILE).read_bytes() == b""


def test_fingerprint_json_is_what_stores_have_always_held(store):
    fingerprint = SPEC.fingerprint()
    legacy = {"schema_version": 1, "task": "toy-point", "task_options": dict(SPEC.task_info().options), "fps": 10,
              "cameras": [["cam", 16, 16]], "state_shapes": {"observation.state": [2]}, "action_shape": [1],
              "video": {"codec": "h264", "crf": 30, "preset": "veryfast", "g": 2, "pix_fmt": "yuv420p"},
              "seed": 0, "chunk_frames": 64}
    assert fingerprint.to_json() == json.dumps(legacy, sort_keys=True)
    assert Fingerprint.from_json(fingerprint.to_json()) == fingerprint
    assert fingerprint.cameras == (CameraSpec("cam", 16, 16),) and fingerprint.cameras[0].shape == (16, 16, 3)
    assert Catalog.open_read_only(store).get_meta("fingerprint") == legacy


@pytest.mark.parametrize(("change", "match"), [
    (lambda d: d.pop("chunk_frames"), "field 'chunk_frames' is missing"),
    (lambda d: d.update(robot="x"), "field 'robot' is unknown"),
    (lambda d: d.update(fps="fast"), "bad 'fps' field"),
    (lambda d: d.update(cameras=[["cam", 16]]), "bad 'cameras' field"),
    (lambda d: d.update(action_shape=[0]), "bad 'action_shape' field"),
    (lambda d: d.update(cameras=[["../up", 16, 16]]), "unsafe"),
])
def test_an_old_or_foreign_fingerprint_is_refused_naming_the_field(change, match):
    data = SPEC.fingerprint().to_dict()
    change(data)
    with pytest.raises(FingerprintError, match=match):
        Fingerprint.from_json(json.dumps(data))


def test_the_export_marker_round_trips_and_a_foreign_one_is_refused(tmp_path, store):
    from demoforge.storage.lerobot.export import export_store

    out = tmp_path / "dataset"
    export_store(store, out)
    marker_path = out.resolve() / "meta" / "demoforge.json"
    raw = json.loads(marker_path.read_text())
    marker = ExportMarker.from_json(raw)
    assert marker.to_json() == raw and marker.total_episodes == 2
    assert marker.dataset_indices() == {r.episode_id: r.dataset_index
                                        for r in open_store(store).attempts(("exported",))}
    del raw["next_files"]
    with pytest.raises(MarkerError, match="'next_files' is missing"):
        ExportMarker.from_json(raw)
    marker_path.unlink()
    marker_path.write_text(json.dumps({**marker.to_json(), "format": 99}))
    with pytest.raises(NotOurDatasetError, match="format 99"):
        resolve_target(out)


def test_no_sql_outside_the_catalog():
    """Only storage/catalog.py opens SQLite and speaks SQL (others may catch sqlite3's exception types)."""
    import re

    sql = re.compile(r"sqlite3\.connect|\b(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM|CREATE TABLE|PRAGMA)\b")
    offenders = [str(p.relative_to(REPO)) for folder in ("pipeline", "stages", "storage", "tools")
                 for p in (REPO / folder).rglob("*.py") if p.name != "catalog.py" and sql.search(p.read_text())]
    assert offenders == []
