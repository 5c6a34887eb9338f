"""The three floors: ``pipeline/`` (the roof: CLI, daemon, job runner, workers, tasks, replay) stands on
``stages/`` (the runtime: contract, records, executor, the stages), which stands on ``storage/`` (the ground:
staging, catalog, schema, LeRobot datasets, samplers, viewer). Imports point down only and never go round in
a circle, counting imports inside functions too: read from the source folders themselves (the ``demoforge/``
package reaches them through symbolic links, which hide them from some tools)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOORS = {"storage": 0, "stages": 1, "pipeline": 2}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("demoforge", *parts)).removesuffix(".__init__")


def import_graph() -> dict[str, set[str]]:
    """Module -> the demoforge modules it imports (``from demoforge.x import y`` counts ``demoforge.x.y`` when
    that is a module)."""
    files = {module_name(p): p for floor in FLOORS for p in (ROOT / floor).rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in files.items():
        graph[name]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for target in targets:
                if target in files and target != name:
                    graph[name].add(target)
    return graph


def floor(module: str) -> int:
    return FLOORS[module.split(".")[1]]


def test_imports_point_down_the_floors_only() -> None:
    graph = import_graph()
    assert len(graph) > 50, "the source folders were not found"
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets if floor(t) > floor(m))
    assert not upward, "imports from a lower floor to a higher one:\n" + "\n".join(upward)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the groups of modules that import each other round a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_no_module_imports_itself_round_a_circle() -> None:
    circles = strongly_connected(import_graph())
    assert not circles, "modules importing each other round a circle:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_checker_sees_an_upward_import_and_a_circle() -> None:
    graph = {"demoforge.storage.a": {"demoforge.pipeline.b"}, "demoforge.pipeline.b": {"demoforge.storage.a"}}
    assert [m for m, ts in graph.items() for t in ts if floor(t) > floor(m)] == ["demoforge.storage.a"]
    assert strongly_connected(graph) == [["demoforge.pipeline.b", "demoforge.storage.a"]]
    assert storage_floor("demoforge.storage.staging") < storage_floor("demoforge.storage.lerobot.format") < \
        storage_floor("demoforge.storage.viewer.source")  # so staging -> lerobot.format would be refused


# The ground floor has floors of its own: its core (staging, catalog, the store, schema, video, the LeRobot
# statistics leaf and its compiled sums), then the LeRobot dataset format and its export, edit and repair
# (storage/lerobot/), then what reads both a store and a dataset (replay's episode source, inspect, the
# samplers, the viewer, the other formats a dataset is converted to).
STORAGE_READERS = ("demoforge.storage.episode_source", "demoforge.storage.inspect", "demoforge.storage.sampling",
                   "demoforge.storage.viewer", "demoforge.storage.convert")


def storage_floor(module: str) -> int:
    if module.startswith(STORAGE_READERS):
        return 2
    return 1 if module.startswith("demoforge.storage.lerobot.") or module == "demoforge.storage.lerobot" else 0


def test_inside_the_ground_floor_imports_point_down_too() -> None:
    """No circle between storage/lerobot/ and the rest of storage/: the core never imports the dataset code
    (LeRobot's statistics are a leaf of the core, storage/lerobot_stats.py), and neither imports the readers."""
    graph = import_graph()
    storage = {m: {t for t in targets if t.startswith("demoforge.storage")} for m, targets in graph.items()
               if m.startswith("demoforge.storage")}
    assert sum(1 for m in storage if storage_floor(m) == 1) > 10, "storage/lerobot/ was not found"
    upward = sorted(f"{m} -> {t}" for m, targets in storage.items() for t in targets
                    if storage_floor(t) > storage_floor(m))
    assert not upward, "imports from a lower floor of storage/ to a higher one:\n" + "\n".join(upward)
    # The statistics and their compiled sums (storage/rgb_sums.py) import nothing else of demoforge.
    leaf = graph["demoforge.storage.lerobot_stats"] - {"demoforge.storage.rgb_sums"}
    assert not leaf, f"storage/lerobot_stats.py must stay a leaf; it imports {sorted(leaf)}"
    sums = graph["demoforge.storage.rgb_sums"]
    assert not sums, f"storage/rgb_sums.py must stay a leaf; it imports {sorted(sums)}"


def test_public_class_names_are_unique_across_the_floors() -> None:
    """One concept, one name: a public class name is defined in one module only (two classes of one name made
    readers guess which one a signature meant)."""
    defined: dict[str, list[str]] = defaultdict(list)
    for floor_name in FLOORS:
        for path in sorted((ROOT / floor_name).rglob("*.py")):
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    defined[node.name].append(module_name(path))
    assert {name: modules for name, modules in defined.items() if len(modules) > 1} == {}
