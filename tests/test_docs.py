"""The worked examples in docs/ run as written."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def python_blocks(name: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(), flags=re.S)


def test_writing_a_task_example_runs(capsys) -> None:
    from demoforge.pipeline.tasks.registry import get_task, task_names, unregister

    block, reactive, typed = python_blocks("writing-a-task.md")
    namespace: dict = {"__name__": "docs_example"}
    try:
        exec(compile(block, "docs/writing-a-task.md", "exec"), namespace)
        results = namespace["results"]
        assert len(results) == 3 and all(r.committable for r in results)
        for r in results:
            assert [s.name for s in r.segments] == ["swing_back", "drive_up"]
            assert r.segments[1].metadata["start_position"] < -0.6
        assert get_task("mountain-car").info().segment_names == ("swing_back", "drive_up")
    finally:
        if "mountain-car" in task_names():  # the example registers it: leave the global registry as it was
            unregister("mountain-car")
    # the reactive example: segments alternate between the controller's two branches, cut where it switches
    exec(compile(reactive, "docs/writing-a-task.md", "exec"), namespace)
    for r in namespace["reactive"]:
        names = [s.name for s in r.segments]
        assert len(names) >= 3 and set(names) == {"swing_back", "drive"}
        assert all(a != b for a, b in zip(names, names[1:]))
        assert r.segments[-1].end_step == r.length and r.segments[0].target == "car"
    # the task contract as protocols: the worked example satisfies them, and is found through its wrapper chain
    exec(compile(typed, "docs/writing-a-task.md", "exec"), namespace)


def test_export_training_snippet_runs(tmp_path):
    """The training-side snippet of docs/export.md, on a small real fetch-pick-place export."""
    import subprocess
    import sys

    from helpers import cli_env, demoforge_argv

    store, dataset = tmp_path / "store", tmp_path / "fetch-dataset"
    done = subprocess.run(demoforge_argv("generate", "--task", "fetch-pick-place", "--episodes", "1", "--option",
                                         "cycles=1", "--option", "image_size=64", "--store", str(store),
                                         "--codec", "h264", "--export", str(dataset)),
                          env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (block,) = python_blocks("export.md")
    block = block.replace('"runs/fetch-dataset"', repr(str(dataset)))
    result = subprocess.run([sys.executable, "-c", block], env=cli_env(HF_HUB_OFFLINE="1"), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "segment ids in this chunk" in result.stdout and "sub-tasks of this episode" in result.stdout


def test_api_page_script_runs(tmp_path):
    """docs/api.md's import list and script, as written, from a fresh process in a scratch folder (its runs/ lands
    there)."""
    import subprocess
    import sys

    from helpers import cli_env

    imports, script = python_blocks("api.md")
    block = imports + "\n" + script
    result = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=cli_env(HF_HUB_OFFLINE="1"),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "2 committed, 2 this run" in result.stdout
    assert "2 episodes" in result.stdout
    assert (tmp_path / "runs" / "api-dataset" / "meta" / "info.json").is_file()


def test_public_api_names_resolve_without_heavy_imports():
    """`import demoforge` and the task-author names load without torch or lerobot."""
    import subprocess
    import sys

    from helpers import cli_env

    code = ("import sys, demoforge\n"
            "from demoforge import Segment, RecordedObservation, TaskInfo, CameraSpec, TaskEntry, register\n"
            "assert 'torch' not in sys.modules and 'lerobot' not in sys.modules, 'heavy import'\n"
            "missing = [n for n in demoforge.__all__ if getattr(demoforge, n, None) is None]\n"
            "assert not missing, missing\n")
    result = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def _floor_maps() -> dict[str, str]:
    """docs/pipeline.md's "The three floors" section, cut into each floor's module maps (a floor's text runs from
    its "`floor/` module map" line to the next floor's)."""
    text = (DOCS / "pipeline.md").read_text()
    section = text[text.index("## The three floors"):]
    section = section[:section.index("\n## ", 3)]
    starts = {floor: section.index(f"`{floor}/` module map") for floor in ("pipeline", "stages", "storage")}
    order = sorted(starts, key=starts.__getitem__)
    return {floor: section[starts[floor]:starts[order[i + 1]] if i + 1 < len(order) else len(section)]
            for i, floor in enumerate(order)}


def test_the_module_maps_name_every_module_where_it_is() -> None:
    """Every module of the three floors is in its floor's map (by file name, or inside a folder the map names as
    a whole, like `cli/`), and every file a map names exists on that floor: a newcomer finds each module where
    the map says."""
    root = DOCS.parent
    missing, absent = [], []
    for floor, text in _floor_maps().items():
        files = [p.relative_to(root / floor) for p in (root / floor).rglob("*.py") if p.name != "__init__.py"]
        for path in files:
            whole = len(path.parts) > 1 and f"`{path.parts[0]}/`" in text and f"`{floor}/{path.parts[0]}/`" not in text
            if not whole and f"`{path.name}`" not in text and f"`{path.name}`," not in text:
                missing.append(f"{floor}/{path}")
        names = {p.name for p in files} | {"__init__.py"} | {p.name for p in root.glob("*.py")}  # setup.py
        absent += [f"{floor}: {name}" for name in re.findall(r"`([a-z_0-9]+\.py)`", text) if name not in names]
    assert not missing, "modules missing from docs/pipeline.md's module maps:\n" + "\n".join(sorted(missing))
    assert not absent, "module maps name files that are not on that floor:\n" + "\n".join(sorted(set(absent)))
