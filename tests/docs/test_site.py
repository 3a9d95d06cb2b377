"""The documentation site and README as its front page: the strict build (every internal link and anchor
resolves, the API reference renders), README's length and its commands against CI's, and every number of
a results table against the results file the benchmark wrote (``<!-- results: PATH ... -->`` above it)."""

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

mkdocs_config = pytest.importorskip("mkdocs.config", reason="the docs extra: pip install -e '.[docs]'")
from mkdocs.commands.build import build  # noqa: E402
from mkdocs.exceptions import Abort  # noqa: E402

PAGES = sorted((REPO / "docs").glob("*.md"))
RESULTS_MARKER = re.compile(r"^<!-- results: (.+) -->$")
NUMBER = re.compile(r"\d+(?:\.\d+)?")
NUMERIC_CELL = re.compile(r"[\d.,\s±()%x+\-<>=~]*\d[\d.,\s±()%x+\-<>=~]*")


def _build(site: Path, docs_dir: Path | None = None) -> None:
    overrides = {"site_dir": str(site)} | ({"docs_dir": str(docs_dir)} if docs_dir else {})
    config = mkdocs_config.load_config(str(REPO / "mkdocs.yml"), **overrides)
    config.plugins.on_startup(command="build", dirty=False)
    try:
        build(config)
    finally:
        config.plugins.on_shutdown()


@pytest.fixture(scope="module")
def site(tmp_path_factory, monkeypatch_module) -> Path:
    out = tmp_path_factory.mktemp("site")
    _build(out)
    return out


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        # the theme's notice about its successor, not about our pages
        patch.setenv("NO_MKDOCS_2_WARNING", "1")
        yield patch


def test_site__builds_strict_with_every_page_and_the_benchmarks_figures(site):
    for page in PAGES:
        built = site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert built.is_file(), page.name
    home = (site / "index.html").read_text()
    # README is the home page, its links rewritten
    assert "Quick start" in home and 'href="own-data/"' in home
    assert (site / "benchmarks/results/quality_digits/accuracy.png").is_file()
    assert (
        'src="../benchmarks/results/quality_digits/accuracy.png"' in (site / "results/index.html").read_text()
    )
    assert "## [0.2.0]" not in (site / "changelog/index.html").read_text()  # included and rendered, not raw


@pytest.mark.slow
def test_site__the_command_line_build_as_a_user_runs_it(tmp_path):
    """``mkdocs build --strict`` itself (the in-process build above shares its configuration), offline."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "WARNING" not in result.stderr and (tmp_path / "site" / "index.html").is_file()


def test_site__the_api_reference_renders_signatures_and_docstrings(site):
    api = (site / "api/index.html").read_text()
    for name in (
        "create_model",
        "MaskedAutoencoderViT",
        "load_backbone",
        "load_mae",
        "export_encoder",
        "feature_pyramid",
        "ImageFolderDataModule",
        "MAEPretrainModule",
        "MAEFinetuneModule",
        "ReconstructionCallback",
        "KNNCallback",
    ):
        assert 'id="mae.' in api and re.search(rf'id="mae\.[\w.]*\b{name}"', api), name
    # arguments, and shapes as written (not as emphasis)
    assert "mask_ratio" in api and "(N, L, p*p*C)" in api


def test_site__a_broken_link_or_anchor_fails_the_strict_build_naming_the_page(tmp_path, monkeypatch_module):
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    for name in ("README.md", "CHANGELOG.md", "LICENSE"):
        shutil.copy(REPO / name, tmp_path / name)
    with (docs / "evaluation.md").open("a") as page:
        page.write("\nSee [the probe](performance.md#no-such-heading) and [gone](no-such-page.md).\n")
    with pytest.raises(Abort, match="warnings in strict mode"):
        _build(tmp_path / "site", docs)


def test_readme__a_front_page_of_at_most_200_lines_linking_every_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", readme))
    assert "own-data.md" in linked  # "pretrain on my own folder": one click from README
    missing = {p.name for p in PAGES} - linked - {"index.md", "changelog.md", "hooks"}
    assert not missing, f"pages README does not link: {sorted(missing)}"


def test_readme__its_test_command_is_what_ci_runs():
    """README's quick start holds the two commands; the second installs, checks and tests as .ci/run does
    (which pins torch first)."""
    readme = (REPO / "README.md").read_text()
    quick_start = readme[readme.index("## Quick start") :].split("```bash")[1].split("```")[0]
    commands = [line for line in quick_start.splitlines() if line and not line.startswith("#")]
    assert commands[0] == "pip install -e . && mae pretrain --config default"

    def plain(words: list[str]) -> list[str]:
        words = words[2:] if words[:2] == ["python", "-m"] else words
        return [w for w in words if w != "--quiet"]

    readme_steps = [plain(shlex.split(step)) for step in commands[1].split(" && ")]
    ci_lines = (REPO / ".ci/run").read_text().splitlines()
    ci_steps = [plain(shlex.split(line)) for line in ci_lines if line.startswith("python ")]
    assert readme_steps[0] == ["apt-get", "update"] and readme_steps[1][:2] == ["apt-get", "install"]
    assert readme_steps[2:] == [step for step in ci_steps if "torch==2.14.1" not in step]


def test_readme__each_measured_headline_is_on_the_page_it_links():
    readme = (REPO / "README.md").read_text()
    measured = readme[readme.index("## Measured") : readme.index("## Citing")]
    bullets = [b.split("\n\n")[0] for b in measured.split("\n- ")[1:]]
    assert len(bullets) >= 5
    for bullet in bullets:
        pages = re.findall(r"\]\(docs/([\w-]+\.md)", bullet)
        assert pages, bullet
        text = " ".join((REPO / "docs" / page).read_text() for page in pages)
        claims = re.sub(r"\]\([^)]*\)", "]", bullet)
        for number in NUMBER.findall(claims):
            assert re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", text), (
                f"README: {number} not on {pages}"
            )


def _tables(path: Path) -> list[tuple[int, list[str], list[list[str]], list[str]]]:
    """``(line, header, rows, sources)`` of every table of ``path`` a results marker stands above."""
    lines = path.read_text().splitlines()
    found = []
    for i, line in enumerate(lines):
        marker = RESULTS_MARKER.match(line)
        if marker:
            end = i + 1
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            cells = [_cells(row) for row in lines[i + 1 : end]]
            assert len(cells) > 2, f"{path.name}:{i + 1}: a results marker with no table under it"
            found.append((i + 2, cells[0], cells[2:], marker.group(1).split()))
    return found


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def _source_numbers(source: Path) -> list[float]:
    if source.suffix == ".json":
        values = []

        def walk(value):
            if isinstance(value, bool):
                return
            if isinstance(value, (int, float)):
                values.extend([value, value * 100])  # fractions are shown as per cent
            elif isinstance(value, dict):
                [walk(v) for v in value.values()]
            elif isinstance(value, list):
                [walk(v) for v in value]
            elif isinstance(value, str):
                values.extend(float(n) for n in NUMBER.findall(value))

        walk(json.loads(source.read_text()))
        return values
    return [float(n) for n in NUMBER.findall(source.read_text())]


def _shown_as(number: str, values: list[float]) -> bool:
    """Some value of the source written with ``number``'s decimals is ``number``
    (TFLOP/s as GFLOP/s / 1000)."""
    decimals = len(number.split(".")[1]) if "." in number else 0
    shown = float(number)
    half_step = 0.5 * 10**-decimals + 1e-9
    return any(
        abs(v - shown) <= half_step or abs(v / 1000 - shown) <= half_step for v in values if math.isfinite(v)
    )


def _row_key(cell: str) -> str:
    return cell.split(" (")[0]


RESULTS_TABLES = [(page, *table) for page in PAGES for table in _tables(page)]


def test_results_tables__each_has_a_marker_and_the_known_tables_are_all_marked():
    assert len(RESULTS_TABLES) >= 10
    marked = {(page.name, source) for page, _, _, _, sources in RESULTS_TABLES for source in sources}
    for source in sorted((REPO / "benchmarks/results").rglob("table.md")):
        rel = source.relative_to(REPO).as_posix()
        if "shapes" not in rel:  # one seed, told in a paragraph
            assert any(rel == s for _, s in marked), f"{rel}: no page shows this results table"


@pytest.mark.parametrize(
    "page, line, header, rows, sources",
    RESULTS_TABLES,
    ids=[f"{page.name}:{line}" for page, line, *_ in RESULTS_TABLES],
)
def test_results_tables__every_number_is_the_results_files(page, line, header, rows, sources):
    """Every number of the table is one the benchmark wrote (at the precision shown); a table copied from a
    Markdown results table also keeps its rows and columns: each shown cell is the source's cell."""
    files = [REPO / source for source in sources]
    for file in files:
        assert file.is_file(), f"{page.name}:{line}: the results file {file} is missing"
    values = [v for file in files for v in _source_numbers(file)]
    for row in rows:
        for cell in row[1:]:
            if NUMERIC_CELL.fullmatch(cell):
                for number in NUMBER.findall(cell):
                    assert _shown_as(number, values), (
                        f"{page.name}:{line}: {number} ({row[0]}) is in none of {sources}"
                    )
    for file in files:
        if file.suffix == ".md":
            source_tables = [t for t in _markdown_tables(file) if t[0][0] == header[0]]
            for source_header, source_rows in source_tables:
                by_key = {_row_key(r[0]): dict(zip(source_header, r, strict=True)) for r in source_rows}
                for row in rows:
                    assert _row_key(row[0]) in by_key, (
                        f"{page.name}:{line}: row {row[0]!r} not in {file.name}"
                    )
                    source = by_key[_row_key(row[0])]
                    for name, cell in zip(header[1:], row[1:], strict=True):
                        where = f"{page.name}:{line}: {row[0]} / {name}"
                        assert source.get(name) == cell, (
                            f"{where}: {cell}, the results file has {source.get(name)}"
                        )


def _markdown_tables(path: Path) -> list[tuple[list[str], list[list[str]]]]:
    tables, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if (
            lines[i].startswith("|")
            and i + 1 < len(lines)
            and re.fullmatch(r"\|[-:| ]+\|", lines[i + 1].strip())
        ):
            end = i + 2
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            tables.append((_cells(lines[i]), [_cells(r) for r in lines[i + 2 : end]]))
            i = end
        else:
            i += 1
    return tables


def test_results_tables__a_changed_number_is_caught():
    values = _source_numbers(REPO / "benchmarks/results/own_data_digits16/results.json")
    assert _shown_as("91.4", values) and _shown_as("0.593", values)
    assert not _shown_as("91.5", values) and not _shown_as("0.594", values)
