"""Hostile input, one table for every command and the Recorder: each row is run against a copy of a small real store
and its LeRobot export whose every file is hashed before and after. A row passes when the command ends with the
exit status it documents, says what was wrong in a few lines that name the input (no traceback, no "internal
error"), and left every watched folder byte for byte as it was, with no output folder half-made.

A new surface adds its rows here: ``CLI_CASES`` for a command line, ``RECORDER_CASES`` for a ``Recorder`` call."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from helpers import run_cli

pytestmark = pytest.mark.slow

#: The fixture's job: small frames, no anti-aliasing, h264 (a few seconds on a CPU).
BASE_JOB = ("--task", "metaworld-reach-v3", "--episodes", "2", "--option", "image_size=64", "--option",
            "antialias=false", "--codec", "h264")
H264 = ("--codec", "h264")
MULTIPLY_OUT = ("--episodes", "1", "--store", "{w}/out")
#: One small episode of the same task, for command lines that are refused before they run it.
ONE = ("--task", "metaworld-reach-v3", "--episodes", "1", "--option", "image_size=64", "--option", "antialias=false")


@dataclass(frozen=True)
class Hostile:
    """One hostile command line. ``argv`` items are formatted with ``{w}``, the test's working folder, which
    holds ``base/store`` (2 committed, exported episodes), ``base/ds`` (their LeRobot export) and whatever
    ``setup`` adds. ``says`` is a fragment of the error line; ``absent`` are paths the command must not create."""

    id: str
    argv: tuple[str, ...]
    says: str
    code: int = 2
    setup: Callable[[Path], None] | None = None
    watched: tuple[str, ...] = ("base",)
    absent: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostileCall:
    """One hostile ``Recorder`` call, made on a recorder of ``RECORDER_FEATURES`` that has saved one episode and
    holds one frame of the next: it must raise ``error`` naming ``says``, and the recording must go on (the
    episode is saved, the root closes and exports) with the first episode unchanged."""

    id: str
    call: Callable[[Any], object]
    error: str
    says: str
    create: dict = field(default_factory=dict)


def _write(path: str, data: bytes) -> Callable[[Path], None]:
    def setup(w: Path) -> None:
        (w / path).parent.mkdir(parents=True, exist_ok=True)
        (w / path).write_bytes(data)
    return setup


def _checkpoint_without_weights(folder: Path) -> None:
    from toy_policies import write_act_checkpoint

    write_act_checkpoint(folder)
    (folder / "model.safetensors").unlink()


def _pruned_copy(w: Path) -> None:
    shutil.copytree(w / "base" / "store", w / "pruned", symlinks=True)
    assert run_cli("prune", "--store", str(w / "pruned"), "--exported").returncode == 0


def _one_episode(store: Path) -> None:
    assert run_cli("generate", *ONE, "--codec", "h264", "--store", str(store)).returncode == 0


def _pose_less_recording(root: Path) -> None:
    """A Recorder loop's dataset of two episodes that name a segment target but record no poses."""
    from demoforge import Recorder

    features = {"observation.state": {"dtype": "float32", "shape": (8,), "names": None},
                "action": {"dtype": "float32", "shape": (4,), "names": None}}
    with Recorder.create(root, fps=10, features=features, codec="h264") as recorder:
        for _ in range(2):
            for _ in range(3):
                recorder.add_frame({"observation.state": np.zeros(8, np.float32), "action": np.zeros(4, np.float32),
                                    "task": "reach"}, segment="reach", target="goal")
            recorder.save_episode()


def _nan_stats(dataset: Path) -> None:
    shutil.copytree(dataset.parent / "base" / "ds", dataset, symlinks=False)
    stats = json.loads((dataset / "meta" / "stats.json").read_text())
    stats["action"]["std"][0] = float("nan")
    (dataset / "meta" / "stats.json").write_text(json.dumps(stats))


CLI_CASES: list[Hostile] = [
    # --- writing where the input lives: an output is never an input, nor inside one, nor an existing dataset ---
    Hostile("export-into-its-own-store", ("export", "--store", "{w}/base/store", "--out", "{w}/base/store/ds"),
            "is inside the store"),
    Hostile("rerender-onto-its-source", ("rerender", "{w}/base/ds", "--out", "{w}/base/ds", *H264), "is the source"),
    Hostile("rerender-inside-its-source", ("rerender", "{w}/base/ds", "--out", "{w}/base/ds/inner", *H264),
            "is inside the source"),
    Hostile("rerender-inside-a-version", ("rerender", "{w}/base/ds", "--out", "{w}/base/ds.versions/x", *H264),
            "is inside the source"),
    Hostile("rerender-around-its-source", ("rerender", "{w}/base/ds", "--out", "{w}/base", *H264),
            "holds the source"),
    Hostile("rerender-onto-another-dataset", ("rerender", "{w}/base/store", "--out", "{w}/base/ds", *H264),
            "already holds a dataset that this rerender's store"),
    Hostile("rerender-onto-a-store", ("rerender", "{w}/base/ds", "--out", "{w}/base/store", *H264),
            "is a non-empty directory that is not a demoforge dataset"),
    Hostile("rerender-onto-a-full-folder", ("rerender", "{w}/base/ds", "--out", "{w}/full", *H264),
            "is a non-empty directory", setup=_write("full/f", b"x"), watched=("base", "full")),
    Hostile("rerender-store-is-its-source", ("rerender", "{w}/base/store", "--out", "{w}/new", "--store",
                                             "{w}/base/store", *H264), "is the source", absent=("new",)),
    Hostile("rerender-store-inside-its-source", ("rerender", "{w}/base/ds", "--out", "{w}/new", "--store",
                                                 "{w}/base/ds/st", *H264), "is inside the source", absent=("new",)),
    Hostile("repair-into-its-source", ("repair", "{w}/base/ds", "--out", "{w}/base/ds/sub"),
            "is inside the dataset to repair"),
    Hostile("repair-onto-its-source", ("repair", "{w}/base/ds", "--out", "{w}/base/ds"), "is the dataset to repair"),
    Hostile("repair-bogus-codec", ("repair", "{w}/base/ds", "--encode-pngs", "--vcodec", "bogus"),
            "Invalid vcodec 'bogus'"),
    Hostile("repair-codec-without-encoding", ("repair", "{w}/base/ds", "--vcodec", "h264"), "give --encode-pngs too"),
    Hostile("edit-into-a-version-folder", ("edit", "{w}/base/ds", "--delete", "0", "--out", "{w}/base/ds.versions/y"),
            "is inside the source dataset"),
    # --- a dataset that is not what it claims: validate fails it (exit 1) ---
    Hostile("validate-non-finite-statistics", ("validate", "{w}/nan"),
            "statistics that are not finite numbers: action std (nan)", code=1, setup=lambda w: _nan_stats(w / "nan"),
            watched=("base", "nan")),
    Hostile("merge-a-dataset-with-itself", ("merge", "{w}/base/ds", "{w}/base/ds", "--out", "{w}/merged"), "both hold",
            absent=("merged",)),
    # --- values refused at the boundary, before anything is written ---
    Hostile("negative-episodes", ("generate", *BASE_JOB[:2], "--episodes", "-1", "--store", "{w}/new"),
            "episodes must be", absent=("new",)),
    Hostile("unknown-task", ("generate", "--task", "no-such-task", "--episodes", "1", "--store", "{w}/new"),
            "no-such-task", absent=("new",)),
    Hostile("task-module-escape", ("generate", "--task", "os:system", "--episodes", "1", "--store", "{w}/new"),
            "os:system", absent=("new",)),
    Hostile("keep-where-code", ("edit", "{w}/base/ds", "--keep-where", "__import__('os').system('true')", "--out",
                                "{w}/kept"), "--keep-where", absent=("kept",)),
    Hostile("randomize-empty-items", ("generate", *ONE, "--randomize", ",,", "--store", "{w}/new"),
            "randomization axes ',,' hold an empty item", absent=("new",)),
    Hostile("randomize-blank", ("generate", *ONE, "--randomize", "", "--store", "{w}/new"),
            "--randomize '': name one or more axes", absent=("new",)),
    Hostile("randomize-trailing-comma", ("generate", *ONE, "--option", "randomize=lighting,", "--store", "{w}/new"),
            "'lighting,' hold an empty item", absent=("new",)),
    Hostile("randomize-unknown-range", ("generate", *ONE, "--option", "randomize.lighting.nosuch=0.1", "--store",
                                        "{w}/new"), "has no option 'randomize.lighting.nosuch'", absent=("new",)),
    Hostile("randomize-emoji-code", ("generate", *ONE, "--randomize", ":smile:", "--store", "{w}/new"),
            "unknown randomization axis ':smile:'", absent=("new",)),
    Hostile("run-randomize-empty", ("run", *ONE, "--randomize", ",,"), "hold an empty item"),
    Hostile("rerender-randomize-empty", ("rerender", "{w}/base/ds", "--out", "{w}/rr", "--randomize", ",,"),
            "hold an empty item", absent=("rr", "rr.store")),
    Hostile("instructions-dev-zero", ("generate", *ONE, "--instructions", "/dev/zero", "--store", "{w}/new"),
            "--instructions /dev/zero: not a regular file", absent=("new",)),
    Hostile("instructions-fifo", ("generate", *ONE, "--instructions", "{w}/fifo", "--store", "{w}/new"),
            "not a regular file", setup=lambda w: os.mkfifo(w / "fifo"), absent=("new",)),
    Hostile("instructions-folder", ("generate", *ONE, "--instructions", "{w}/base", "--store", "{w}/new"),
            "not a regular file", absent=("new",)),
    Hostile("instructions-too-big", ("generate", *ONE, "--instructions", "{w}/big.json", "--store", "{w}/new"),
            "larger than 65536 bytes", setup=_write("big.json", b" " * 70000), absent=("new",)),
    Hostile("takeover-emoji-code", ("generate", *ONE, "--driver", "x:y", "--takeover", "gap:-1:3", "--store",
                                    "{w}/new"), "--takeover 'gap:-1:3'", absent=("new",)),
    Hostile("task-emoji-code", ("generate", "--task", ":smile:", "--episodes", "1", "--store", "{w}/new"),
            "unknown task ':smile:'", absent=("new",)),
    Hostile("keep-where-deep-parens", ("edit", "{w}/base/ds", "--keep-where", "(" * 5000 + "success" + ")" * 5000,
                                       "--out", "{w}/kept"), "nested more than 50 deep", absent=("kept",)),
    Hostile("keep-where-deep-not", ("edit", "{w}/base/ds", "--keep-where", "not " * 5000 + "success", "--out",
                                    "{w}/kept"), "nested more than 50 deep", absent=("kept",)),
    # --- the policy loop's options, and drivers that cannot be built: refused before a store exists ---
    Hostile("noise-unknown-segment", ("generate", *ONE, "--noise", "gaussian:0.1@nosuchseg", "--store", "{w}/new"),
            "has no segment 'nosuchseg'; its segments are reach", absent=("new",)),
    Hostile("takeover-without-driver", ("generate", *ONE, "--takeover", "", "--store", "{w}/new"),
            "--takeover '': --beta and --takeover need --driver", absent=("new",)),
    Hostile("beta-without-driver", ("generate", *ONE, "--beta", "0.5", "--store", "{w}/new"),
            "--beta 0.5: --beta and --takeover need --driver", absent=("new",)),
    Hostile("policy-timeout-without-driver", ("generate", *ONE, "--policy-timeout", "5", "--store", "{w}/new"),
            "--beta and --takeover need --driver", absent=("new",)),
    Hostile("takeover-empty-rule", ("generate", *ONE, "--driver", "toy_policies:down", "--takeover", "", "--store",
                                    "{w}/new"), "--takeover '': unknown rule", absent=("new",)),
    Hostile("driver-empty", ("generate", *ONE, "--driver", "", "--store", "{w}/new"),
            "--driver '': name a LeRobot checkpoint folder or module:factory", absent=("new",)),
    Hostile("policy-timeout-above-step-timeout", ("generate", *ONE, "--driver", "toy_policies:down",
                                                  "--policy-timeout", "90", "--store", "{w}/new"),
            "must be below the step timeout", absent=("new",)),
    Hostile("driver-factory-raises", ("generate", *ONE, "--driver", "toy_policies:unbuildable", "--store", "{w}/new"),
            "--driver toy_policies:unbuildable: building the policy raised RuntimeError", absent=("new",)),
    Hostile("eval-driver-factory-raises", ("eval", *ONE, "--driver", "toy_policies:unbuildable", "--store",
                                           "{w}/new"), "building the policy raised RuntimeError", absent=("new",)),
    Hostile("eval-negative-policy-timeout", ("eval", *ONE, "--driver", "toy_policies:down", "--policy-timeout", "-1",
                                             "--store", "{w}/new"), "--policy-timeout must be >= 0", absent=("new",)),
    Hostile("eval-checkpoint-config-only", ("eval", *ONE, "--driver", "{w}/ck", "--store", "{w}/new"),
            "its config.json declares no input and no output features",
            setup=_write("ck/config.json", b'{"type": "act"}'), absent=("new",)),
    Hostile("eval-checkpoint-without-weights", ("eval", *ONE, "--option", "full_state=true", "--driver", "{w}/ck",
                                                "--store", "{w}/new"), "building the policy raised FileNotFoundError",
            setup=lambda w: _checkpoint_without_weights(w / "ck"), absent=("new",)),
    Hostile("replay-a-pruned-store", ("replay", "{w}/pruned"), "committed episode(s) were pruned",
            setup=lambda w: _pruned_copy(w), watched=("base", "pruned")),
    # --- multiply: a source it cannot use is refused at start, nothing written ---
    Hostile("multiply-source-of-another-task", ("multiply", "{w}/base/store", "--task", "fetch-pick-place",
                                                *MULTIPLY_OUT), "holds episodes of task 'metaworld-reach-v3', not",
            absent=("out",)),
    Hostile("multiply-missing-source", ("multiply", "{w}/base/missing", *MULTIPLY_OUT), "does not exist",
            absent=("out",)),
    Hostile("multiply-empty-folder", ("multiply", "{w}/emptydir", *MULTIPLY_OUT), "is neither a demoforge store",
            setup=lambda w: (w / "emptydir").mkdir(), absent=("out",)),
    Hostile("multiply-negative-interpolation", ("multiply", "{w}/base/store", "--interpolation", "-1",
                                                *MULTIPLY_OUT), "--interpolation must be in 0..1000", absent=("out",)),
    Hostile("multiply-unknown-option", ("multiply", "{w}/base/store", "--option", "bogus=1", *MULTIPLY_OUT),
            "has no option 'bogus'", absent=("out",)),
    Hostile("multiply-one-episode-source", ("multiply", "{w}/one", *MULTIPLY_OUT),
            "holds 1 episode: multiply needs at least 2 source demonstrations", setup=lambda w: _one_episode(w / "one"),
            watched=("base", "one"), absent=("out",)),
    Hostile("multiply-recording-without-task", ("multiply", "{w}/rec", *MULTIPLY_OUT),
            "was written by a Recorder, whose episodes name no task", setup=lambda w: _pose_less_recording(w / "rec"),
            watched=("base", "rec"), absent=("out",)),
    Hostile("multiply-recording-without-poses", ("multiply", "{w}/rec", "--task", "metaworld-reach-v3",
                                                 *MULTIPLY_OUT), "records no observation.eef_pose",
            setup=lambda w: _pose_less_recording(w / "rec"), watched=("base", "rec"), absent=("out",)),
    Hostile("robosuite-unknown-camera", ("generate", "--task", "robosuite-lift", "--option", "camera=front",
                                         "--episodes", "1", "--store", "{w}/new"),
            "option 'camera' must be one or more of agentview, robot0_eye_in_hand", absent=("new",)),
    Hostile("robosuite-tiny-image", ("generate", "--task", "robosuite-lift", "--option", "image_size=8", "--episodes",
                                     "1", "--store", "{w}/new"), "option 'image_size' must be in 32..512",
            absent=("new",)),
    Hostile("robosuite-long-episodes", ("generate", "--task", "robosuite-lift", "--option", "max_steps=501",
                                        "--episodes", "1", "--store", "{w}/new"),
            "option 'max_steps' must be in 1..500", absent=("new",)),
    Hostile("init-range-too-narrow", ("generate", "--task", "fetch-pick-place", "--option", "init_range=0.05",
                                      "--episodes", "1", "--store", "{w}/new"),
            "option 'init_range' must be in 0.1..1.0", absent=("new",)),
    Hostile("init-range-nan", ("generate", *ONE, "--option", "init_range=nan", "--store", "{w}/new"),
            "option 'init_range' must be float", absent=("new",)),
    Hostile("init-range-undeclared", ("generate", "--task", "metaworld-button-press-v3", "--option", "init_range=0.5",
                                      "--episodes", "1", "--store", "{w}/new"), "'init_range' is declared for",
            absent=("new",)),
    Hostile("keep-where-source-episode-string", ("edit", "{w}/base/ds", "--keep-where", 'source_episode == "0"',
                                                 "--out", "{w}/kept"), "cannot compare source_episode (a number) with",
            absent=("kept",)),
    Hostile("multiply-into-its-source", ("multiply", "{w}/base/store", "--episodes", "1", "--store",
                                         "{w}/base/store"), "was created for a different job"),
    # --- convert and trim: refused before anything is written ---
    Hostile("convert-into-its-dataset", ("convert", "{w}/base/ds", "--format", "lerobot-v2.1", "--out",
                                         "{w}/base/ds/v21"), "is inside the dataset"),
    Hostile("convert-onto-an-existing-folder", ("convert", "{w}/base/ds", "--format", "lerobot-v2.1", "--out",
                                                "{w}/exists"), "exists: a conversion is written to a new path",
            setup=lambda w: (w / "exists").mkdir(), watched=("base", "exists")),
    Hostile("convert-a-store", ("convert", "{w}/base/store", "--format", "lerobot-v2.1", "--out", "{w}/v21"),
            "is not a LeRobot v3.0 dataset (no meta/info.json)", absent=("v21",)),
    Hostile("convert-into-a-missing-folder", ("convert", "{w}/base/ds", "--format", "lerobot-v2.1", "--out",
                                              "{w}/no/such/v21"), "does not exist", absent=("no",)),
    Hostile("convert-onto-an-existing-file", ("convert", "{w}/base/ds", "--format", "robomimic-hdf5", "--out",
                                              "{w}/x.hdf5"), "exists: a conversion is written to a new path",
            setup=_write("x.hdf5", b"keep"), watched=("base", "x.hdf5")),
    Hostile("convert-into-its-meta", ("convert", "{w}/base/ds", "--format", "robomimic-hdf5", "--out",
                                      "{w}/base/ds/meta/x.hdf5"), "a conversion is written apart from its dataset"),
    Hostile("trim-inside-a-segment", ("edit", "{w}/base/ds", "--trim", "start=3"), "inside its segment 'reach'"),
    Hostile("trim-unknown-segment", ("edit", "{w}/base/ds", "--trim", "segments=idle"), "no segment is named 'idle'"),
    Hostile("trim-everything", ("edit", "{w}/base/ds", "--trim", "segments=reach"), "would leave episode 0 empty"),
    Hostile("trim-past-the-end", ("edit", "{w}/base/ds", "--trim", "start=1000"), "would leave episode 0 ("),
    Hostile("trim-negative", ("edit", "{w}/base/ds", "--trim", "start=-1"), "is not a number of frames"),
    Hostile("trim-nothing", ("edit", "{w}/base/ds", "--trim", "start=0"), "drops no frame"),
    Hostile("trim-counts-and-segments", ("edit", "{w}/base/ds", "--trim", "start=2,segments=reach"), "not both"),
    Hostile("trim-with-delete", ("edit", "{w}/base/ds", "--trim", "start=2", "--delete", "0"),
            "--trim is an edit of its own"),
    Hostile("trim-bogus", ("edit", "{w}/base/ds", "--trim", "bogus"), "is not start=N, end=N or segments=NAME+NAME"),
    Hostile("trim-twice-the-same-end", ("edit", "{w}/base/ds", "--trim", "start=1,start=2"), "start is given twice"),
    Hostile("option-not-key-value", ("run", *BASE_JOB[:2], "--episodes", "1", "--option", "image_size"),
            "KEY=VALUE"),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A 2-episode Meta-World reach store and its export, made once for the file; each test works on a copy."""
    root = tmp_path_factory.mktemp("hostile-base")
    done = run_cli("generate", *BASE_JOB, "--store", str(root / "base" / "store"), "--export",
                   str(root / "base" / "ds"))
    assert done.returncode == 0, done.stderr
    return root


@pytest.fixture
def work(base: Path, tmp_path: Path) -> Path:
    shutil.copytree(base / "base", tmp_path / "base", symlinks=True)
    return tmp_path


def _reader_trace(item: Path) -> bool:
    """SQLite's shared-memory index and an empty write-ahead log (any reader of the WAL-mode catalog makes them),
    and the store's lock file, which holds the pid of the last process that asked for it."""
    return (item.name in ("writer.lock", "export.lock") or item.name.endswith(".sqlite-shm")
            or (item.name.endswith(".sqlite-wal") and item.stat().st_size == 0))


def tree_hash(path: Path) -> str:
    """Every name, link target and byte below ``path`` (modes left out: a read-only setup changes them)."""
    digest = hashlib.sha256()
    if not path.exists() and not path.is_symlink():
        return "absent"
    for folder, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if Path(folder, d).is_symlink()]:
            item = Path(folder, name)
            if _reader_trace(item):
                continue
            digest.update(str(item.relative_to(path)).encode() + b"\0")
            if item.is_symlink():
                digest.update(b"link:" + os.readlink(item).encode())
            else:
                digest.update(hashlib.sha256(item.read_bytes()).digest())
        digest.update(b"dirs:" + "\0".join(dirs).encode())
    return digest.hexdigest()


def assert_refused(done, case: Hostile) -> None:
    text = done.stdout + done.stderr
    assert done.returncode == case.code, f"{case.id}: exit {done.returncode}\n{text}"
    assert "Traceback" not in text and "internal error" not in text, f"{case.id}:\n{text}"
    assert case.says in text, f"{case.id}: {case.says!r} not in\n{text}"
    if case.code == 2:  # refused: the error line first; what follows is short (where, what next, accepted forms)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert 1 <= len(lines) <= 25, f"{case.id}: expected a few lines, got {len(lines)}:\n{done.stderr}"
        assert "error" in lines[0], f"{case.id}: {lines[0]!r}"


@pytest.mark.parametrize("case", CLI_CASES, ids=lambda c: c.id)
def test_a_hostile_command_line_is_refused_and_changes_nothing(case: Hostile, work: Path) -> None:
    if case.setup is not None:
        case.setup(work)
    before = {name: tree_hash(work / name) for name in case.watched}
    done = run_cli(*(arg.format(w=work) for arg in case.argv), timeout=240)
    assert_refused(done, case)
    assert {name: tree_hash(work / name) for name in case.watched} == before, f"{case.id} changed a source"
    for name in case.absent:
        assert not (work / name).exists(), f"{case.id} left {name} behind"


RECORDER_FEATURES = {
    "observation.state": {"dtype": "float32", "shape": (2,), "names": ["x", "y"]},
    "action": {"dtype": "float32", "shape": (2,), "names": ["dx", "dy"]},
}


def recorder_frame(step: int = 0) -> dict:
    return {"observation.state": np.full(2, step, np.float32), "action": np.full(2, 0.5, np.float32),
            "task": "hold still"}


RECORDER_CASES: list[HostileCall] = [
    HostileCall("nan-state", lambda r: r.add_frame({**recorder_frame(), "observation.state": np.array(
        [np.nan, 0], np.float32)}), "FrameError", "observation.state"),
    HostileCall("missing-action", lambda r: r.add_frame({"observation.state": np.zeros(2, np.float32),
                                                         "task": "hold still"}), "FrameError", "action"),
    HostileCall("wrong-shape", lambda r: r.add_frame({**recorder_frame(), "action": np.zeros(3, np.float32)}),
                "FrameError", "action"),
    HostileCall("instruction-number", lambda r: r.add_frame(recorder_frame(), segment="hold", instruction=12345),
                "FrameError", "instruction: expected a non-empty string of at most 1000 characters"),
    HostileCall("instruction-too-long", lambda r: r.add_frame(recorder_frame(), segment="other",
                                                                instruction="x" * 1001), "FrameError",
                "got 1001 characters"),
    HostileCall("empty-target", lambda r: r.add_frame(recorder_frame(), segment="other", target=""), "FrameError",
                "target=''"),
    HostileCall("task-changes-mid-episode", lambda r: r.add_frame({**recorder_frame(), "task": "other"}),
                "FrameError", "task"),
]


@pytest.mark.parametrize("case", RECORDER_CASES, ids=lambda c: c.id)
def test_a_hostile_recorder_call_is_refused_and_the_recording_goes_on(case: HostileCall, tmp_path: Path) -> None:
    from demoforge import Recorder
    from demoforge.pipeline import recorder as recorder_module

    root = tmp_path / "rec"
    with Recorder.create(root, fps=10, features=RECORDER_FEATURES, codec="h264", **case.create) as recorder:
        for step in range(3):
            recorder.add_frame(recorder_frame(step), segment="hold")
        assert recorder.save_episode() == 0
        first = tree_hash(root)
        recorder.add_frame(recorder_frame(), segment="hold")
        with pytest.raises(getattr(recorder_module, case.error)) as raised:
            case.call(recorder)
        assert case.says in str(raised.value), f"{case.id}: {raised.value}"
        assert tree_hash(root) == first, f"{case.id} changed the published dataset"
        recorder.add_frame(recorder_frame(1), segment="hold")
        assert recorder.save_episode() == 1
    done = run_cli("export", "--store", f"{root}.store", "--out", str(tmp_path / "again"))
    assert done.returncode == 0, done.stderr


def test_recorder_names_that_do_not_fit_the_shape_are_refused_and_nothing_is_created(tmp_path: Path) -> None:
    from demoforge import Recorder
    from demoforge.pipeline.recorder import RecorderError

    features = {**RECORDER_FEATURES, "action": {"dtype": "float32", "shape": (2,), "names": ["a", "b", "c"]}}
    with pytest.raises(RecorderError, match="feature 'action': 'names' must be None or 2 distinct"):
        Recorder.create(tmp_path / "rec", fps=10, features=features)
    assert not (tmp_path / "rec").exists() and not (tmp_path / "rec.store").exists()
