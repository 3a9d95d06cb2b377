"""CHANGELOG.md against the code: its newest release is the package's version; every spelling the code
refuses as removed (``REMOVED``, ``mae/cli/command_options.py``) is listed with the spelling to use under that
release's Removed section, and each listed pair is refused by the commands that have the new spelling,
with a message naming it; every config key renamed (``RENAMES``, ``mae/training/settings.py``) is
listed with its new key under its release's Changed section; the old module paths 0.2.0 listed no
longer import, and are the code's table of moves (``MOVES``). The tables are read from the
code, not kept here, so a removal added to the code without a line in the changelog fails. In-process,
nothing run.
"""

import contextlib
import importlib
import io
import re
from datetime import date
from functools import cache
from pathlib import Path

import pytest

import mae
from mae.cli.command_options import REMOVED, refuse_removed
from mae.cli.commands import COMMANDS, TRAIN
from mae.training.settings import MOVES, RENAMES

REPO = Path(__file__).resolve().parents[2]
CHANGELOG = REPO / "CHANGELOG.md"
RELEASE = re.compile(r"^## \[(?P<version>\d+\.\d+\.\d+)\] - (?P<date>\d{4}-\d{2}-\d{2})\s*$", re.MULTILINE)
HEADING = re.compile(r"^## \[(?P<name>[^\]]+)\]", re.MULTILINE)
SECTION = re.compile(r"^### (?P<name>.+?)\s*$", re.MULTILINE)
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")  # Keep a Changelog 1.1.0
OPTION_PAIR = re.compile(r"`(?P<old>--?[\w.-]+)` → `(?P<new>--?[\w.-]+)`")
REMOVED_IN = "0.3.0"  # the release that removed the spellings of REMOVED (0.2's renamed flags)
MODULE_MOVE = re.compile(r"^\s+- `(?P<old>mae\.[\w.]+)` → `mae\.", re.MULTILINE)


def releases(text: str) -> list[tuple[str, str, str]]:
    """(version, date, body) of each release, newest first as written; ``[Unreleased]`` left out."""
    found = []
    headings = list(HEADING.finditer(text))
    for heading, following in zip(headings, [*headings[1:], None], strict=True):
        release = RELEASE.match(text, heading.start())
        if release is not None:
            body = text[heading.end() : following.start() if following else len(text)]
            found.append((release["version"], release["date"], body))
    return found


def sections(body: str) -> dict[str, str]:
    """A release's ``### Kind`` sections: kind -> its text."""
    headings = list(SECTION.finditer(body))
    return {
        heading["name"]: body[heading.end() : following.start() if following else len(body)]
        for heading, following in zip(headings, [*headings[1:], None], strict=True)
    }


@cache
def command_parsers() -> dict[str, object]:
    """The parser of every command that is not a LightningCLI one (those have jsonargparse's dotted keys)."""
    return {command.name: command.build_parser() for command in COMMANDS if command.group != TRAIN}


def unlisted_removals(removed: str) -> list[str]:
    """The ``REMOVED`` pairs that ``removed`` (a Removed section) does not list on one line."""
    return [
        f"{old} -> {new}"
        for old, new in REMOVED.items()
        if not any(f"`{old}`" in line and f"`{new}`" in line for line in removed.splitlines())
    ]


def refusal(name: str, old: str) -> str | None:
    """The error command ``name`` stops with when given option ``old`` (None: it goes on)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
        refuse_removed(command_parsers()[name], [old, "value"])
        return None
    return err.getvalue().strip().splitlines()[-1]


CHANGELOG_TEXT = CHANGELOG.read_text(encoding="utf-8")
RELEASES = releases(CHANGELOG_TEXT)


def _changed_of_newest() -> str:
    return sections(RELEASES[0][2]).get("Changed", "")


def test_changelog__keep_a_changelog_layout():
    assert CHANGELOG_TEXT.startswith("# Changelog\n")
    assert "https://keepachangelog.com/en/1.1.0/" in CHANGELOG_TEXT
    assert len(RELEASES) >= 2 and RELEASES[-1][0] == "0.1.0", [r[0] for r in RELEASES]
    names = [h["name"] for h in HEADING.finditer(CHANGELOG_TEXT)]
    assert all(name == "Unreleased" or RELEASE.search(f"## [{name}] - 2000-01-01") for name in names), names
    versions = [tuple(map(int, version.split("."))) for version, _, _ in RELEASES]
    dates = [date.fromisoformat(day) for _, day, _ in RELEASES]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions), versions
    assert dates == sorted(dates, reverse=True), dates
    for version, _, body in RELEASES:
        kinds = list(sections(body))
        assert kinds and all(kind in KINDS for kind in kinds), f"{version}: sections {kinds}, allowed {KINDS}"


def test_changelog__the_newest_release_is_the_package_version():
    """Fails until ``mae.__version__`` (and pyproject.toml) is raised with a new release entry, or the
    other way round."""
    assert RELEASES[0][0] == mae.__version__, (
        f"CHANGELOG's newest release {RELEASES[0][0]}, mae {mae.__version__}"
    )


def test_changelog__every_removed_spelling_is_listed_with_the_one_to_use():
    removed = sections(release_body(REMOVED_IN)).get("Removed", "")
    assert removed, f"no Removed section in {REMOVED_IN}"
    missing = unlisted_removals(removed)
    assert not missing, f"refused by the code, not in CHANGELOG.md's {REMOVED_IN} Removed section: {missing}"
    assert len(OPTION_PAIR.findall(removed)) >= len(REMOVED)


def unlisted_renames(changed: str, renames: dict[str, str]) -> list[str]:
    """The ``renames`` pairs (a release's rows of ``RENAMES``) that ``changed`` (its Changed section) does
    not list on one line as `` `old` → `new` ``."""
    lines = changed.splitlines()
    return [
        f"{old} -> {new}" for old, new in renames.items() if not any(f"`{old}` → `{new}`" in x for x in lines)
    ]


def release_body(version: str) -> str:
    """Release ``version``'s body; the ``[Unreleased]`` one while that release is not written yet."""
    bodies = {release: body for release, _, body in RELEASES}
    if version in bodies:
        return bodies[version]
    start = CHANGELOG_TEXT.index("## [Unreleased]")
    return CHANGELOG_TEXT[start : CHANGELOG_TEXT.index("\n## [", start)]


@pytest.mark.parametrize("release", sorted(RENAMES))
def test_changelog__every_renamed_config_key_is_listed_with_its_new_key(release):
    missing = unlisted_renames(sections(release_body(release)).get("Changed", ""), RENAMES[release])
    assert not missing, f"renamed in the code, not in CHANGELOG.md's {release} Changed section: {missing}"


def test_checks__a_rename_added_to_the_code_without_a_changelog_line_fails():
    changed = sections(release_body("0.3.0"))["Changed"]
    renames = {**RENAMES["0.3.0"], "model.frobnicate": "model.optim.frobnicate"}
    assert unlisted_renames(changed, renames) == ["model.frobnicate -> model.optim.frobnicate"]


@pytest.mark.parametrize("old, new", sorted(REMOVED.items()))
def test_removed_spelling__every_command_stops_with_the_spelling_to_use(old, new):
    for name in command_parsers():
        message = refusal(name, old)
        assert message is not None and f"{old} was renamed {new}" in message, (name, message)


def test_removed_spelling__after_a_bare_double_dash_is_left_alone():
    assert refusal("knn", "--") is None
    refuse_removed(command_parsers()["knn"], ["--", "--k"])


@pytest.mark.parametrize("release", sorted(MOVES))
def test_changelog__the_moved_modules_are_the_codes_table_of_moves(release):
    """``MOVES`` (what a config's old class path is refused with) lists the modules that release's Changed
    section lists as moved, and no other."""
    changed = sections(release_body(release))["Changed"]
    extra = sorted(set(MODULE_MOVE.findall(changed)) - set(MOVES[release]))
    assert not extra, f"in CHANGELOG.md's {release} Changed section, not in MOVES: {extra}"
    unlisted = [old for old in MOVES[release] if f"`{old}`" not in changed]
    assert not unlisted, f"in MOVES, not in CHANGELOG.md's {release} Changed section: {unlisted}"


@pytest.mark.parametrize("release, listed", [("0.2.0", 25), ("0.4.0", 6)])
def test_removed_modules__the_old_paths_a_release_moved_no_longer_import(release, listed):
    moved = sections(release_body(release))["Changed"]
    old_paths = MODULE_MOVE.findall(moved)
    assert len(old_paths) >= listed, old_paths  # the list in that release's Changed section
    still = []
    for old in old_paths:
        try:
            importlib.import_module(old)
            still.append(old)
        except ModuleNotFoundError:
            pass
    assert not still, f"still import: {still}"


def test_checks__a_removal_added_to_the_code_without_a_changelog_line_fails(monkeypatch):
    removed = sections(release_body(REMOVED_IN))["Removed"]
    monkeypatch.setitem(REMOVED, "--frobnicate", "--frobnicate-level")
    assert unlisted_removals(removed) == ["--frobnicate -> --frobnicate-level"]
    monkeypatch.delitem(REMOVED, "--frobnicate")
    without_k = "\n".join(line for line in removed.splitlines() if "`--k`" not in line)
    assert unlisted_removals(without_k) == ["--k -> -k"]
