"""The troubleshooting pages (docs/troubleshooting/*.md) against the code: every message they quote can
still be printed, every ``## mae <command>`` heading names a real command, and no page outgrows the size at
which it is split by command. Read in-process, nothing run.

The pages' format (stated on index.md): a message is a line of a fenced ``text`` block, or an inline code
span starting with ``error: ``. A printed prefix is taken off (``error: ``, ``mae: error: ``, ``mae
<command>: error: ``, an ``[Errno N] `` after it, or the ``SomeError: `` of a traceback's last line).
``<...>`` marks a part that varies (a path, a number, a name; ``'<x>'`` when Python quotes it), and the
fixed text between the placeholders, each fragment, must be fixed text of a string literal under ``mae/``
(docstrings left out): inside one literal, or, where the code fills a field of an f-string with another
string (``f"{setting} is not shorter than the run ({total} steps{run})"`` with ``run = f" of {n} per
epoch"``, a constant such as ``METADATA``), across that field: the fixed parts of one f-string in order,
each field between them filled with a whole constant, the fragment starting or ending inside a field's
value. So a message reworded or deleted in the code fails here, naming the page's line and the fragment
that is gone.
"""

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs" / "troubleshooting").glob("*.md"))
SOURCE = REPO / "mae"

FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
INLINE_ERROR = re.compile(r"`(error: [^`]+)`")
PLACEHOLDER = re.compile(r"""(['"]?)<[^<>\n]+>\1""")
PREFIX = re.compile(r"^(?:mae(?: [a-z]+)?: )?error: (?:\[Errno \d+\] )?|^[A-Z]\w*Error: ")
COMMAND_HEADING = re.compile(r"^##\s+mae\s+(?P<names>.+?)\s*$")
SEPARATOR = "\x00"  # between the literals in the searched text: no page line holds it
# A fragment with fewer letters and digits than this (", ", " (") is not looked up: it occurs anywhere.
MIN_CHECKED = 3
# Each message must have one fragment at least this long, so it cannot be all placeholders.
MIN_ANCHOR = 12
# Letters and digits the part of a crossing fragment inside a field's value must hold.
MIN_PIECE = 2
MIN_MESSAGES = 40
# A page past this many lines is split by command (issue 66).
MAX_PAGE_LINES = 1300


# ------------------------------------------------------------------------------------ the code's strings


def string_templates(root: Path) -> list[tuple[str, ...]]:
    """``source_templates`` of every Python file under ``root``."""
    return [
        template
        for path in sorted(root.rglob("*.py"))
        for template in source_templates(path.read_text("utf-8"))
    ]


def source_templates(code: str) -> list[tuple[str, ...]]:
    """The fixed parts of every string literal of Python ``code``, docstrings left out: ``(text,)`` for a
    plain literal, the parts between the fields for an f-string (adjacent literals are one, as Python
    joins them; ``""`` where two fields touch or a field starts or ends it)."""
    tree = ast.parse(code)
    # skipped: docstrings, and the parts of f-strings (read with their f-string)
    templates, skipped = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skipped.add(id(first.value))
        if isinstance(node, ast.JoinedStr):
            skipped.update(id(value) for value in node.values)
            parts = [""]
            for value in node.values:
                if isinstance(value, ast.Constant):
                    parts[-1] += str(value.value)
                else:
                    parts.append("")
            templates.append(tuple(parts))
    templates += [
        (node.value,)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped
    ]
    return templates


def piece(text: str) -> bool:
    return sum(char.isalnum() for char in text) >= MIN_PIECE


def _starts(text: str, char: str) -> Iterator[int]:
    """The positions of ``char`` in ``text``."""
    position = text.find(char)
    while position != -1:
        yield position
        position = text.find(char, position + 1)


class Literals:
    """The string literals of a source tree, searchable for a page's fragments."""

    def __init__(self, templates: list[tuple[str, ...]]) -> None:
        self.text = (
            SEPARATOR + SEPARATOR.join(part for template in templates for part in template) + SEPARATOR
        )
        self.whole = {template[0] for template in templates if len(template) == 1}
        self.firsts = SEPARATOR + SEPARATOR.join(template[0] for template in templates)
        self.lasts = SEPARATOR.join(template[-1] for template in templates) + SEPARATOR
        self.f_strings = [template for template in templates if len(template) > 1]

    def has(self, fragment: str) -> bool:
        """Whether ``fragment`` is fixed text of one literal, or of an f-string across its fields."""
        return fragment in self.text or any(self._across(fragment, parts) for parts in self.f_strings)

    def _value_start(self, text: str) -> bool:
        """Whether ``text`` can start a field's value: the start of a literal."""
        return piece(text) and SEPARATOR + text in self.firsts

    def _value_end(self, text: str) -> bool:
        return piece(text) and text + SEPARATOR in self.lasts

    def _across(self, fragment: str, parts: tuple[str, ...]) -> bool:
        """``fragment`` as the text of the f-string of fixed ``parts`` with its fields filled, crossing at
        least one field: it starts inside a fixed part or a field's value (the end of a literal), each
        field it passes holds a whole constant, and it ends inside a field's value (the start of a
        literal) or a fixed part."""
        last = len(parts) - 1
        reached = set()  # (position in fragment, the field it has reached)
        for i, part in enumerate(parts[:-1]):  # starting inside fixed part i
            for position in _starts(part, fragment[0]):
                tail = part[position:]
                if len(tail) < len(fragment) and fragment.startswith(tail):
                    reached.add((len(tail), i))
        for m, part in enumerate(parts[1:], 1):  # starting inside the value of field m - 1
            for position in _starts(fragment, part[:1]) if part else ():
                if position == 0 or not self._value_end(fragment[:position]):
                    continue
                rest = fragment[position:]
                if part.startswith(rest):
                    return True
                if rest.startswith(part) and m < last:
                    reached.add((position + len(part), m))
        while reached:
            position, field = reached.pop()
            rest = fragment[position:]
            if not rest or self._value_start(rest):
                return True
            following = parts[field + 1]
            for end in range(1, len(rest) + 1):
                if rest[:end] not in self.whole:
                    continue
                after = rest[end:]
                if following.startswith(after):
                    return True
                if following and after.startswith(following) and field + 1 < last:
                    reached.add((position + end + len(following), field + 1))
        return False


@cache
def source_literals() -> Literals:
    return Literals(string_templates(SOURCE))


# ------------------------------------------------------------------------------------ the page's messages


def page_messages(text: str) -> Iterator[tuple[int, str]]:
    """(line number, message) of every line of a ``text`` block and every inline `` `error: ...` `` span."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = (opening[1], opening[2].lower())
            continue
        if fence is not None:
            if line.strip().startswith(fence[0]) and not line.strip().strip(fence[0][0]):
                fence = None
            elif fence[1] == "text" and line.strip():
                yield number, line.strip()
            continue
        for span in INLINE_ERROR.findall(line):
            yield number, span


def fragments(message: str) -> list[str]:
    """The fixed text of ``message`` between its placeholders, the printed prefix taken off."""
    return [
        part for part in PLACEHOLDER.split(PREFIX.sub("", message, count=1)) if part and part not in "'\""
    ]


def checked(fragment: str) -> bool:
    return sum(char.isalnum() for char in fragment) >= MIN_CHECKED


def message_problems(message: str, literals: Literals) -> list[str]:
    """Why ``message`` could not be printed by the code: its fragments that no literal holds, or too
    little fixed text to tell."""
    parts = [part for part in fragments(message) if checked(part)]
    problems = [f"not in mae/: {part!r}" for part in parts if not literals.has(part)]
    if not any(len(part.strip()) >= MIN_ANCHOR for part in parts):
        problems.append(f"no fixed text of {MIN_ANCHOR}+ characters between the placeholders to check")
    return problems


def command_headings(text: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, the command names) of every ``## mae a, b`` heading outside code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening[1]
        elif fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
        elif heading := COMMAND_HEADING.match(line):
            yield (
                number,
                [name.strip() for name in re.split(r",|/|\band\b", heading["names"]) if name.strip()],
            )


PAGE_TEXTS = {page.name: page.read_text(encoding="utf-8") for page in PAGES}
# (page, line number, message)
MESSAGES = [(name, n, message) for name, text in PAGE_TEXTS.items() for n, message in page_messages(text)]


# ------------------------------------------------------------------------------------ tests


def test_page__quotes_the_messages_in_its_format():
    assert len(PAGE_TEXTS) >= 8, sorted(PAGE_TEXTS)
    assert len(MESSAGES) >= MIN_MESSAGES, (
        f"{len(MESSAGES)} messages found on {sorted(PAGE_TEXTS)}: the format changed?"
    )
    assert sum(message.startswith("error: ") for _, _, message in MESSAGES) >= MIN_MESSAGES


@pytest.mark.parametrize("page, number, message", MESSAGES, ids=[f"{page}:{n}" for page, n, _ in MESSAGES])
def test_page__each_message_is_still_in_the_code(page, number, message):
    problems = message_problems(message, source_literals())
    assert not problems, f"docs/troubleshooting/{page}:{number}: {message[:100]}\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("page", sorted(PAGE_TEXTS))
def test_page__is_short_enough_to_read(page):
    lines = PAGE_TEXTS[page].count("\n")
    assert lines <= MAX_PAGE_LINES, f"docs/troubleshooting/{page} has {lines} lines: split it by command"


def test_matcher__a_made_up_or_reworded_message_is_reported():
    literals = source_literals()
    made_up = "error: the flux capacitor <name> is out of plutonium; refuel it before <date>"
    assert message_problems(made_up, literals) == [
        "not in mae/: 'the flux capacitor '",
        "not in mae/: ' is out of plutonium; refuel it before '",
    ]
    real = "error: --out must end in .safetensors (a timm ViT) or .onnx (an ONNX file), got <out>"
    assert message_problems(real, literals) == []
    reworded = real.replace("must end in", "should end with")
    assert message_problems(reworded, literals) == [f"not in mae/: {fragments(reworded)[0]!r}"]
    assert message_problems("error: <path> is <n>", literals)  # nothing fixed to check: reported too


def test_matcher__messages_built_from_several_strings_and_constants():
    code = """
METADATA = "mae_shards.json"
setting, run = f"model.optim.warmup_epochs={warmup}", f" of {n} per epoch"
a = f"{setting} ({warmup_steps} steps) is not shorter than the run ({total} steps{run}); lower it"
b = f"{out} holds an earlier conversion (named in its {METADATA} and index.json files)"
c = f"mae demo: {err}"
d = f"port {port} is busy"
"""
    templates = source_templates(code)
    assert ("", " (", " steps) is not shorter than the run (", " steps", "); lower it") in templates
    literals = Literals(templates)
    assert literals.has(" steps of ")  # a field filled with another f-string: its start
    assert literals.has("named in its mae_shards.json and index")  # a field filled with a constant
    assert literals.has("mae demo: port ")  # a message inside another
    assert not literals.has(" steps off ")
    assert not literals.has("its mae_shards.json or index")
    assert not literals.has("mae demo: porch ")
    assert literals.has(" of mae_shards.json per")  # what the code could print: any constant fills a field
    assert not literals.has("); lower it of ")  # nothing follows that message


def test_page_reader__placeholders_prefixes_and_where_messages_are():
    text = "\n".join(
        [
            "Prose with `error: inline <x> message` and `not a message`.",
            "```text",
            "error: [Errno 28] no space <n> left",
            "```",
            "```bash",
            "mae env",
            "```",
            "```text",
            "FileExistsError: <out> is not empty: it holds '<name>' there",
            "mae demo: error: busy <p>",
            "```",
        ]
    )
    assert list(page_messages(text)) == [
        (1, "error: inline <x> message"),
        (3, "error: [Errno 28] no space <n> left"),
        (9, "FileExistsError: <out> is not empty: it holds '<name>' there"),
        (10, "mae demo: error: busy <p>"),
    ]
    assert fragments("error: [Errno 28] no space <n> left") == ["no space ", " left"]
    assert fragments("FileExistsError: <out> is not empty: it holds '<name>' there") == [
        " is not empty: it holds ",
        " there",
    ]


def test_page__every_command_heading_names_a_real_command():
    from mae.cli.commands import BY_NAME

    headings = [(page, n, names) for page, text in PAGE_TEXTS.items() for n, names in command_headings(text)]
    assert len(headings) >= 8, headings
    unknown = [
        f"docs/troubleshooting/{page}:{n}: {name}"
        for page, n, names in headings
        for name in names
        if name not in BY_NAME
    ]
    assert not unknown, f"headings naming no command of mae/cli/commands.py: {unknown}"
    assert list(
        command_headings("## mae pretrain, finetune\n```text\n## mae not-a-heading\n```\n## mae pretrian")
    ) == [
        (1, ["pretrain", "finetune"]),
        (5, ["pretrian"]),
    ]
