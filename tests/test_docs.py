"""The worked examples in docs/ run as written."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def python_blocks(name: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(), flags=re.S)


def test_writing_a_task_example_runs(capsys):
    (block,) = python_blocks("writing-a-task.md")
    namespace: dict = {"__name__": "docs_example"}
    exec(compile(block, "docs/writing-a-task.md", "exec"), namespace)
    results = namespace["results"]
    assert len(results) == 3 and all(r.committable for r in results)
    for r in results:
        assert [s.name for s in r.segments] == ["swing_back", "drive_up"]
        assert r.segments[1].metadata["start_position"] < -0.6
    from demoforge.pipeline.tasks.registry import get_task
    assert get_task("mountain-car").info().segment_names == ("swing_back", "drive_up")
