"""Every shell block of README.md and docs/*.md runs as pasted: a newcomer's path (issue 62).

The ```` ```bash ```` blocks run in reading order (README.md, then the docs pages in the order README's "Where to
read next" lists them) in ONE scratch folder shared by all pages, as a person who follows the docs has one
repository root: each block with bash (``set -euo pipefail``), the venv's ``bin`` first on PATH (README's one
convention, ``source .venv/bin/activate``), after the substitutions declared in :data:`SHRINK` (fewer episodes,
small images, two training steps). A block that cannot run here says why in a marker on the line before its
fence, ``<!-- doc-test: skip: REASON -->``. The measurement logs (:data:`LOGS`) keep their ``.venv/bin/...``
commands and are not run. The Python examples run in tests/test_docs.py and tests/test_recorder.py.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOGS = ("performance.md", "performance-history.md", "reliability-history.md")  # measurement logs: not run
READING_LIST = "## Where to read next"  # README's section that orders the docs pages
FENCE = re.compile(r"^(\s*)```(.*)$")
MARKER = re.compile(r"^\s*<!--\s*doc-test:(.*?)-->\s*$")
SKIP = re.compile(r"^\s*skip\s*:\s*(\S.*?)\s*$")
LINKED = ("docs", "tools", "pyproject.toml")  # what the docs' commands read, reachable from the scratch folder
BLOCK_TIMEOUT_S = 300
PLACEHOLDER = re.compile(r"\[--|\(or:")  # synopsis syntax: `[--json]`, "(or: ...)" cannot be pasted
CRASH_TEXT = ("Exception ignored", "internal error", "Traceback (most recent call last)")


@dataclass(frozen=True)
class Shrink:
    """One declared substitution: ``pattern`` (a regular expression, ``re.M``) becomes ``replacement``."""

    pattern: str
    replacement: str
    why: str


JOB_TASK = r"(\bdemoforge (?:generate|run|eval) [^\n]*?--task )"  # the task of a job (not `edit --task`)

# Applied in this order to every block that runs; each must change some block (a stale one fails the test).
SHRINK = (
    Shrink(r"^bash tools/setup\.sh && ", "", "the suite runs after the set-up"),
    Shrink(r"--episodes 20 --seed 1 --store runs/export-", "--episodes 3 --seed 1 --store runs/export-",
           "export.md's curation deletes an episode, then splits the two left"),
    Shrink(r"--episodes (?!3\b)\d+", "--episodes 1", "any other count: one episode per job (per member of a suite)"),
    Shrink(JOB_TASK + r"(fetch-pick-place|metaworld-[\w-]+)", r"\1\2 --option image_size=64 --option antialias=false",
           "64x64 images without multisampling (the MuJoCo tasks sized by image_size)"),
    Shrink(JOB_TASK + r"((?:aloha|so101)-[\w-]+)",
           r"\1\2 --option image_height=64 --option image_width=64 --option antialias=false",
           "the same for the tasks sized by height and width"),
    Shrink(r"image_size=(?!64\b)\d+", "image_size=64", "a rerender to another size: 64x64 too"),
    Shrink(r"\bdemoforge (generate|rerender) ", r"demoforge \1 --codec h264 ", "h264: AV1 is slower to start"),
    Shrink(r"--workers [3-9]\d*", "--workers 2", "two workers on two cores"),
    Shrink(r"--variants \d+", "--variants 2", "two appearance variants"),
    Shrink(r"--delete 3,7,10-12\b", "--delete 1", "the shrunk curation dataset holds episodes 0-2"),
    Shrink(r"--split train=0\.9,val=0\.1", "--split train=0.5,val=0.5", "two episodes split in two parts"),
    Shrink(r"--delete 0-9 --dry-run", "--delete 0 --dry-run", "the shrunk dataset holds two episodes then"),
    Shrink(r"--steps=\d+", "--steps=2", "two training steps prove the dataset trains"),
    Shrink(r"--batch_size=\d+", "--batch_size=2", "a batch of two"),
    Shrink(r"\blerobot-train ", "lerobot-train --num_workers=0 ",
           "no data-loader processes: starting them costs a minute, two steps need none"),
)


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: where it opens (1-based line of the fence), its type, its text, why it is skipped."""

    page: str
    line: int
    lang: str
    text: str
    skip: str | None


def parse(path: Path) -> tuple[list[Block], list[str]]:
    """The page's fenced blocks, and what is wrong with its fences and markers (file:line: problem)."""
    page = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    marker: tuple[int, str | None] | None = None  # (line, reason) of a marker waiting for its fence
    i = 0
    while i < len(lines):
        found = MARKER.match(lines[i])
        if found:
            reason = SKIP.match(found.group(1))
            if reason is None:
                problems.append(f"{page}:{i + 1}: a doc-test marker must read "
                                f"'<!-- doc-test: skip: REASON -->' with a reason: {lines[i].strip()!r}")
            marker = (i + 1, reason.group(1) if reason else None)
            i += 1
            continue
        fence = FENCE.match(lines[i])
        if fence is None:
            if marker is not None:
                problems.append(f"{page}:{marker[0]}: a doc-test marker not on the line before a fence")
                marker = None
            i += 1
            continue
        indent, lang = fence.group(1), fence.group(2).strip()
        if not lang:
            problems.append(f"{page}:{i + 1}: an untyped fence (```bash for commands, ```text for output, "
                            "diagrams and trees)")
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            problems.append(f"{page}:{i + 1}: a fence that is never closed")
            break
        text = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:end])
        skip = marker[1] if marker else None
        if marker is not None and lang != "bash":
            problems.append(f"{page}:{marker[0]}: a doc-test marker before a ```{lang} block (only bash runs)")
        if lang == "bash" and PLACEHOLDER.search(text):
            problems.append(f"{page}:{i + 1}: synopsis syntax ([--option], (or: ...)) in a bash block: move the "
                            "synopsis to prose or a ```text block")
        blocks.append(Block(page, i + 1, lang, text + "\n", skip))
        marker = None
        i = end + 1
    if marker is not None:
        problems.append(f"{page}:{marker[0]}: a doc-test marker not on the line before a fence")
    return blocks, problems


def reading_order() -> list[Path]:
    """README.md, then the docs pages in the order its "Where to read next" section names them."""
    readme = (ROOT / "README.md").read_text()
    assert READING_LIST in readme, f"README.md has no '{READING_LIST}' section"
    section = readme.split(READING_LIST, 1)[1].split("\n## ", 1)[0]
    names = list(dict.fromkeys(re.findall(r"docs/([\w.-]+\.md)", section)))
    return [ROOT / "README.md"] + [ROOT / "docs" / name for name in names if name not in LOGS]


def shrink(text: str) -> tuple[str, set[int]]:
    """The block with :data:`SHRINK` applied, and which substitutions changed it."""
    used = set()
    for n, rule in enumerate(SHRINK):
        text, count = re.subn(rule.pattern, rule.replacement, text, flags=re.M)
        if count:
            used.add(n)
    return text, used


def test_every_docs_page_is_in_the_reading_order():
    """The order the commands run in is README's list: a page missing from it would never run."""
    listed = {path.name for path in reading_order()[1:]}
    pages = {path.name for path in (ROOT / "docs").glob("*.md")} - set(LOGS)
    assert pages <= listed, f"README.md's '{READING_LIST}' does not list {sorted(pages - listed)}"


def test_every_fence_is_typed_and_every_marker_says_why():
    problems = [problem for path in reading_order() for problem in parse(path)[1]]
    assert not problems, "\n".join(problems)


def test_the_page_checks_name_each_problem_by_line(tmp_path):
    """The checks above can fail: each kind of problem is found, at its line."""
    page = tmp_path / "page.md"
    page.write_text("<!-- doc-test: skip -->\n```bash\ndemoforge tasks\n```\n"  # a marker without a reason
                    "```\nuntyped\n```\n"
                    "<!-- doc-test: skip: why -->\n\ntext\n"  # a marker not before a fence
                    "```bash\ndemoforge status --store DIR [--json]\n```\n"
                    "<!-- doc-test: skip: why -->\n```text\noutput\n```\n")
    blocks, problems = parse(page)
    assert [problem.split(":")[1] for problem in problems] == ["1", "5", "8", "11", "14"], problems
    assert [(block.line, block.lang, block.skip) for block in blocks] == \
        [(2, "bash", None), (5, "", None), (11, "bash", None), (15, "text", "why")]


def test_the_readme_test_command_is_the_one_ci_runs():
    """README's second set-up command is .ci/run's, byte for byte."""
    (ci,) = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("bash tools/setup.sh")]
    bash = [block.text.strip() for block in parse(ROOT / "README.md")[0] if block.lang == "bash"]
    assert ci in bash, "README.md does not show .ci/run's test command as a block of its own"


def children_cpu() -> float:
    """CPU seconds (user and system) of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def scratch_folder(tmp_path: Path) -> Path:
    """The newcomer's repository root: the docs, tools and project file of this checkout, and its venv."""
    folder = tmp_path / "newcomer"
    folder.mkdir()
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name)
    (folder / ".venv").symlink_to(Path(sys.prefix))
    return folder


def run_block(script: Path, folder: Path, env: dict[str, str]) -> tuple[int | None, str]:
    """Run one block's script with bash in the scratch folder: its exit status (None: still running after
    :data:`BLOCK_TIMEOUT_S`, then its whole process group is killed) and its output, stdout and stderr together."""
    with subprocess.Popen(["bash", str(script)], cwd=folder, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as process:
        try:
            output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            return None, output
    return process.returncode, output


def verdict(where: str, text: str, status: int | None, output: str) -> str | None:
    """Why a block failed (with the block as run and its output's tail), or None."""
    if status is None:
        problem = f"still running after {BLOCK_TIMEOUT_S} s"
    elif status != 0:
        problem = f"exit {status}"
    else:
        crash = [marker for marker in CRASH_TEXT if marker in output]
        if not crash:
            return None
        problem = f"exit 0, but its output says {crash}"
    return f"{where}: {problem}\n--- as run:\n{text}--- output tail:\n{output[-3000:]}"


@pytest.mark.slow
def test_documented_commands_run_as_pasted(tmp_path):
    folder = scratch_folder(tmp_path)
    scripts = tmp_path / "blocks"
    scripts.mkdir()
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
               PYTHONDONTWRITEBYTECODE="1")  # PYTHONPATH=docs/examples must not write into the checkout
    env.pop("PYTHONPATH", None)
    used: set[int] = set()
    ran = 0
    for path in reading_order():
        for block in parse(path)[0]:
            if block.lang != "bash" or block.skip is not None:
                continue
            text, changed = shrink(block.text)
            used |= changed
            script = scripts / f"{ran:02d}-{block.page.replace('/', '-')}-{block.line}.sh"
            script.write_text("set -euo pipefail\n" + text)
            ran += 1
            started, cpu = time.monotonic(), children_cpu()
            status, output = run_block(script, folder, env)
            where = f"{block.page}:{block.line}"
            print(f"{where}: exit {status} in {time.monotonic() - started:.1f} s, "  # shown with -s
                  f"{children_cpu() - cpu:.1f} CPU-s")
            failed = verdict(where, text, status, output)
            if failed:
                pytest.fail(failed, pytrace=False)
    assert ran >= 10, f"only {ran} blocks ran: did the reading order or the fences change?"
    stale = [SHRINK[n] for n in range(len(SHRINK)) if n not in used]
    assert not stale, f"substitutions that changed no block (remove them): {stale}"
