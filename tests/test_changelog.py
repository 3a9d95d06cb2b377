"""CHANGELOG.md against the code: its newest release is the package's version, and every old spelling the
code still accepts is listed under that release's Changed section. The old spellings are read from the
code's own tables, not from a list kept here: ``RENAMED`` (options whose name changed,
``mae/command_options.py``), the old positional forms each command's parser takes (``legacy_positionals``),
and ``MOVED`` (old module paths, ``mae/moved.py``). So a rename added to the code without a line in the
changelog fails here. The other way round, each ``old`` → ``new`` option pair the changelog lists must
still be accepted by some command. In-process, nothing run.
"""

import contextlib
import io
import re
from datetime import date
from functools import cache
from pathlib import Path

import pytest

import mae
from mae.cli.commands import COMMANDS, TRAIN
from mae.command_options import LEGACY_POSITIONALS_DEST, RENAMED, legacy_argv
from mae.moved import MOVED

REPO = Path(__file__).resolve().parents[1]
CHANGELOG = REPO / "CHANGELOG.md"
RELEASE = re.compile(r"^## \[(?P<version>\d+\.\d+\.\d+)\] - (?P<date>\d{4}-\d{2}-\d{2})\s*$", re.MULTILINE)
HEADING = re.compile(r"^## \[(?P<name>[^\]]+)\]", re.MULTILINE)
SECTION = re.compile(r"^### (?P<name>.+?)\s*$", re.MULTILINE)
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")  # Keep a Changelog 1.1.0
OPTION_PAIR = re.compile(r"`(?P<old>--?[\w.-]+)` → `(?P<new>--?[\w.-]+)`")


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
    """The parser of every command that is not a LightningCLI one (those take the old spellings)."""
    return {command.name: command.build_parser() for command in COMMANDS if command.group != TRAIN}


def legacy_positional_forms() -> list[str]:
    """The old positional form of each command that still takes one, as its usage read:
    ``mae export CHECKPOINT OUT``, ``mae shard ROOT OUT``."""
    forms = []
    for name, parser in command_parsers().items():
        positionals = [action for action in parser._actions if not action.option_strings]
        legacy = [action for action in positionals if action.dest == LEGACY_POSITIONALS_DEST]
        if legacy:
            words = [action.dest.upper() for action in positionals if action.dest != LEGACY_POSITIONALS_DEST]
            forms.append(" ".join(["mae", name, *words, *(n.upper() for n in legacy[0].legacy_names)]))
    return forms


def missing_old_spellings(changed: str) -> list[str]:
    """What the code still accepts under an old spelling that ``changed`` (a Changed section) does not
    list: each ``RENAMED`` pair on one line, each old positional form, each ``MOVED`` module."""
    missing = [
        f"{old} -> {new}"
        for old, new in RENAMED.items()
        if not any(f"`{old}`" in line and f"`{new}`" in line for line in changed.splitlines())
    ]
    missing += [form for form in legacy_positional_forms() if f"`{form}`" not in changed]
    missing += [old for old in MOVED if f"`{old}`" not in changed]
    return missing


def accepted_by(old: str, new: str) -> list[str]:
    """The commands that rewrite option ``old`` to ``new`` (with their note)."""
    commands = []
    for name, parser in command_parsers().items():
        with contextlib.redirect_stderr(io.StringIO()):
            if legacy_argv(parser, [old]) == [new]:
                commands.append(name)
    return commands


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
    assert RELEASES[0][0] == mae.__version__, f"CHANGELOG's newest release {RELEASES[0][0]}, mae {mae.__version__}"


def test_changelog__every_old_spelling_the_code_accepts_is_in_the_release_that_changed_it():
    changed = _changed_of_newest()
    assert changed, f"no Changed section in {RELEASES[0][0]}"
    assert legacy_positional_forms(), "no command takes an old positional form: the table moved?"
    missing = missing_old_spellings(changed)
    assert not missing, f"accepted by the code, not in CHANGELOG.md's {RELEASES[0][0]} Changed section: {missing}"
    assert "`--snake_case`" in changed  # the general rule legacy_argv applies (--max_epochs -> --max-epochs, ...)


def test_changelog__each_listed_rename_still_runs():
    pairs = OPTION_PAIR.findall(_changed_of_newest())
    assert len(pairs) >= len(RENAMED), pairs
    not_accepted = [f"{old} -> {new}" for old, new in pairs if not accepted_by(old, new)]
    assert not not_accepted, f"listed as renamed, but no command accepts the old spelling: {not_accepted}"


def test_checks__a_rename_added_to_the_code_without_a_changelog_line_fails(monkeypatch):
    changed = _changed_of_newest()
    monkeypatch.setitem(RENAMED, "--frobnicate", "--frobnicate-level")
    assert missing_old_spellings(changed) == ["--frobnicate -> --frobnicate-level"]
    monkeypatch.delitem(RENAMED, "--frobnicate")
    without_k = "\n".join(line for line in changed.splitlines() if "`--k`" not in line)
    assert missing_old_spellings(without_k) == ["--k -> -k"]
    without_export = changed.replace("`mae export CHECKPOINT OUT`", "")
    assert missing_old_spellings(without_export) == ["mae export CHECKPOINT OUT"]
    monkeypatch.setitem(MOVED, "mae.eval.flux", "mae.apps.flux")
    assert missing_old_spellings(changed) == ["mae.eval.flux"]


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("--k", "-k", ["knn", "search"]),  # RENAMED applies wherever -k exists: search always had it
        ("--max_epochs", "--max-epochs", ["probe"]),
        ("--frobnicate", "--frobnicate-level", []),
    ],
)
def test_checks__accepted_by_reads_the_parsers(old, new, expected):
    assert accepted_by(old, new) == expected
