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
        storage_floor("demoforge.pipeline.viewer.source")  # so staging -> lerobot.format would be refused


# The ground floor has floors of its own: its core (staging, catalog, the store, schema, video, the LeRobot
# statistics leaf and its compiled sums), then the LeRobot dataset format and its export, edit and repair
# (storage/lerobot/), then what reads both a store and a dataset (replay's episode source, inspect, the
# samplers, the viewer, the other formats a dataset is converted to).
STORAGE_READERS = ("demoforge.storage.episode_source", "demoforge.storage.inspect", "demoforge.storage.sampling",
                   "demoforge.pipeline.viewer", "demoforge.storage.convert")


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


# The store owns its catalog: what others read of it and the states they change are Store methods
# (storage/store.py), so the rules of a state change live in one class. Above storage/ (and in tools/ and
# tests/), no module reaches a store's catalog attribute; inside storage/, only the store touches its private one.
CATALOG_ATTRIBUTES = ("catalog", "_catalog")


def catalog_reaches(source: str, path: str = "<source>") -> list[int]:
    """Lines of ``source`` that reach a ``catalog`` (or ``_catalog``) attribute of anything."""
    return sorted(node.lineno for node in ast.walk(ast.parse(source, path))
                  if isinstance(node, ast.Attribute) and node.attr in CATALOG_ATTRIBUTES)


def test_no_module_but_the_store_reaches_a_store_catalog() -> None:
    files = [p for folder in ("pipeline", "stages", "storage", "tools", "tests")
             for p in sorted((ROOT / folder).rglob("*.py")) if p != ROOT / "storage" / "store.py"]
    assert len(files) > 100, "the source folders were not found"
    reached = [f"{p.relative_to(ROOT)}:{line}" for p in files for line in catalog_reaches(p.read_text(), str(p))]
    assert not reached, ("a store's catalog reached outside storage/store.py (add a Store method):\n"
                         + "\n".join(reached))


# A test hook is a fault (storage/faults.py: one object, read from the environment in one place), never a
# parameter of a signature other modules call: product code does not carry what only tests use.
TEST_HOOK_PARAMETERS = frozenset({"pause", "stage_pause", "before_flip", "delay_s", "fault", "faults"})


def hook_parameters(source: str, path: str = "<source>") -> list[str]:
    """``function(parameter)`` for each public function or method of ``source`` (its name and its class's not
    starting with ``_``) that takes a test hook."""
    found: list[str] = []

    def visit(node: ast.AST, private: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, private or child.name.startswith("_"))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                public = not private and (not child.name.startswith("_") or child.name == "__init__")
                args = child.args
                found.extend(f"{child.name}({a.arg})" for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)
                             if public and a.arg in TEST_HOOK_PARAMETERS)

    visit(ast.parse(source, path), False)
    return found


def test_no_product_signature_takes_a_test_hook() -> None:
    files = [p for floor_name in FLOORS for p in sorted((ROOT / floor_name).rglob("*.py"))]
    hooked = [f"{p.relative_to(ROOT)}: {f}" for p in files for f in hook_parameters(p.read_text(), str(p))]
    assert not hooked, "test hooks in product signatures (read them from storage/faults.py):\n" + "\n".join(hooked)


def test_the_checkers_see_a_catalog_reached_and_a_hook_taken() -> None:
    assert catalog_reaches("rows = store.catalog.committed()\nstore._catalog.close()\n") == [1, 2]
    assert catalog_reaches("from demoforge.storage.catalog import Catalog\nrows = store.committed()\n") == []
    source = ("def export(out, *, stage_pause=None): ...\nclass Store:\n    def commit(self, before_flip): ...\n"
              "    def _flip(self, pause): ...\nclass _Private:\n    def __init__(self, delay_s): ...\n"
              "class Encoder:\n    def __init__(self, delay_s=0.0): ...\n")
    assert hook_parameters(source) == ["export(stage_pause)", "commit(before_flip)", "__init__(delay_s)"]
