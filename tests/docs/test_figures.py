"""Every figure a page shows (``![...](path)``) exists and is at least as new as the results file of what it
illustrates, so a rerun benchmark whose figures were not regenerated (or a figure left from an older run)
is caught.

What a figure illustrates: a figure in a benchmark's results folder (``benchmarks/results/<run>/``) the
results file of that folder that a ``<!-- results: PATH -->`` marker of its section names, else the results
file its benchmark wrote beside it (``results.md``, ``table.md`` or ``results.json``); any other figure the
files named by the nearest results marker above it in its section (none: it only has to exist).

How new: where the repository is a git work tree and the figure and its results file are both committed
and unmodified, the time of the last commit of each (a fresh clone gives every file its checkout time);
otherwise their modification times.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

FIGURE = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.(?:png|svg|jpg))\)")
RESULTS_MARKER = re.compile(r"^<!-- results: (.+) -->$")
HEADING = re.compile(r"^#{1,6} ")
RESULTS_BESIDE = ("results.md", "table.md", "results.json")
BENCHMARK_RESULTS = "benchmarks/results"


def pages(root: Path) -> list[Path]:
    """The site's pages and README (the home page includes it; its links are relative to the root)."""
    return [*sorted((root / "docs").glob("*.md")), root / "README.md"]


def figures(page: Path, root: Path) -> list[tuple[int, Path, list[Path]]]:
    """``(line, figure, results files)`` of every figure ``page`` shows, outside code blocks."""
    found, markers, fenced = [], [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        if HEADING.match(line):
            markers = []
        elif marker := RESULTS_MARKER.match(line):
            markers = [root / source for source in marker.group(1).split()]
        for link in FIGURE.findall(line):
            figure = (page.parent / link).resolve()
            found.append((number, figure, illustrated(figure, markers, root)))
    return found


def illustrated(figure: Path, markers: list[Path], root: Path) -> list[Path]:
    """The results files ``figure`` illustrates, given the files its section's nearest marker names."""
    folder = figure.parent
    if folder.parent == (root / BENCHMARK_RESULTS).resolve():
        named = [source for source in markers if source.resolve().parent == folder]
        return named or [folder / name for name in RESULTS_BESIDE if (folder / name).is_file()][:1]
    return markers


def _git(root: Path, *args: str) -> str | None:
    result = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    return result.stdout if result.returncode == 0 else None


def ages(paths: list[Path], root: Path) -> tuple[list[float], str]:
    """How new each of ``paths`` is (seconds), and by which clock: ``"commit times"`` where ``root`` is a git
    work tree and every path is committed and unmodified, else ``"modification times"``."""
    names = [path.resolve().relative_to(root.resolve()).as_posix() for path in paths]
    if _git(root, "rev-parse", "--is-inside-work-tree") == "true\n":
        tracked = _git(root, "ls-files", "-z", "--", *names)
        changed = _git(root, "status", "--porcelain", "--", *names)
        if tracked is not None and set(tracked.split("\0")) >= set(names) and changed == "":
            times = [_git(root, "log", "-1", "--format=%ct", "--", name) for name in names]
            if all(t and t.strip() for t in times):
                return [float(t) for t in times], "commit times"
    return [os.stat(path).st_mtime for path in paths], "modification times"


def problems(root: Path) -> list[str]:
    """One line per figure that is missing or older than a results file it illustrates."""
    found = []
    for page in pages(root):
        for line, figure, sources in figures(page, root):
            where = f"{page.relative_to(root)}:{line}: {figure.relative_to(root.resolve())}"
            if not figure.is_file():
                found.append(f"{where} does not exist")
                continue
            for source in sources:
                if not source.is_file():
                    continue  # a missing results file is test_site.py's to report
                (figure_time, source_time), clock = ages([figure, source], root)
                if figure_time < source_time:
                    found.append(
                        f"{where} is older than {source.relative_to(root)} (by {clock}): "
                        "rerun the benchmark that writes both"
                    )
    return found


def test_figures__every_figure_on_a_page_exists_and_is_as_new_as_its_results():
    shown = [figure for page in pages(REPO) for _, figure, _ in figures(page, REPO)]
    assert len(shown) >= 15
    assert not problems(REPO)


def test_figures__a_figure_in_a_results_folder_illustrates_that_folders_results_file():
    by_figure = {figure: sources for page in pages(REPO) for _, figure, sources in figures(page, REPO)}
    tables = REPO / BENCHMARK_RESULTS
    assert by_figure[(tables / "quality_digits/accuracy.png").resolve()] == [
        tables / "quality_digits/results.md"
    ]
    # under the progressive table's section, but the shapes run's figure
    assert by_figure[(tables / "time_to_quality_shapes/accuracy_vs_time.png").resolve()] == [
        (tables / "time_to_quality_shapes/table.md").resolve()
    ]


def _site(root: Path, figure_line: str) -> tuple[Path, Path]:
    """A repository ``root`` with one page showing ``figure_line`` below a results table."""
    run = root / BENCHMARK_RESULTS / "run"
    run.mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "README.md").write_text("# tool\n\n```text\n![not a figure](nothing.png)\n```\n")
    (root / "docs/results.md").write_text(
        f"# Results\n\n<!-- results: {BENCHMARK_RESULTS}/run/results.md -->\n| a | b |\n|---|---|\n"
        f"| x | 1 |\n\n{figure_line}\n"
    )
    figure, results = run / "plot.png", run / "results.md"
    figure.write_bytes(b"png")
    results.write_text("| a | b |\n|---|---|\n| x | 1 |\n")
    return figure, results


def test_figures__a_stale_or_missing_figure_is_caught_by_modification_time(tmp_path):
    figure, results = _site(tmp_path, f"![plot](../{BENCHMARK_RESULTS}/run/plot.png) ![gone](gone.png)")
    os.utime(figure, (1_000_000, 1_000_000))
    os.utime(results, (1_000_000, 1_000_000))
    assert problems(tmp_path) == ["docs/results.md:8: docs/gone.png does not exist"]
    os.utime(results, (1_000_001, 1_000_001))  # the results rewritten, the figure not
    assert problems(tmp_path)[0] == (
        f"docs/results.md:8: {BENCHMARK_RESULTS}/run/plot.png is older than "
        f"{BENCHMARK_RESULTS}/run/results.md (by modification times): rerun the benchmark that writes both"
    )


def test_figures__in_a_fresh_clone_commit_times_decide_not_checkout_times(tmp_path):
    figure, results = _site(tmp_path, f"![plot](../{BENCHMARK_RESULTS}/run/plot.png)")

    def commit(paths: list[Path], date: str) -> None:
        env = {**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        subprocess.run(["git", "add", *map(str, paths)], cwd=tmp_path, check=True)
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", date],
            cwd=tmp_path,
            check=True,
            env=env,
        )

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    commit([tmp_path / "README.md", tmp_path / "docs", figure], "2026-01-01T00:00:00Z")
    commit([results], "2026-01-02T00:00:00Z")  # a newer table committed without its figure
    os.utime(results, (1_000_000, 1_000_000))  # checkout order says nothing
    assert ages([figure, results], tmp_path)[1] == "commit times"
    assert problems(tmp_path) == [
        f"docs/results.md:8: {BENCHMARK_RESULTS}/run/plot.png is older than "
        f"{BENCHMARK_RESULTS}/run/results.md (by commit times): rerun the benchmark that writes both"
    ]
    figure.write_bytes(b"png2")
    commit([figure], "2026-01-02T00:00:00Z")  # regenerated and committed with the same time: as new
    assert problems(tmp_path) == []
    # regenerated but not committed: modification times decide
    figure.write_bytes(b"png3")
    os.utime(figure, (1_000_000, 1_000_000))
    os.utime(results, (1_000_001, 1_000_001))
    assert ages([figure, results], tmp_path)[1] == "modification times" and len(problems(tmp_path)) == 1


@pytest.mark.parametrize("name", RESULTS_BESIDE)
def test_figures__a_figure_without_a_marker_in_its_section_is_held_to_the_results_beside_it(tmp_path, name):
    run = tmp_path / BENCHMARK_RESULTS / "run"
    run.mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(f"![plot]({BENCHMARK_RESULTS}/run/plot.png)\n")
    (run / "plot.png").write_bytes(b"png")
    (run / name).write_text("{}")
    os.utime(run / "plot.png", (1_000_000, 1_000_000))
    assert problems(tmp_path) == [
        f"README.md:1: {BENCHMARK_RESULTS}/run/plot.png is older than {BENCHMARK_RESULTS}/run/{name} "
        "(by modification times): rerun the benchmark that writes both"
    ]
