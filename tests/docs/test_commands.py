"""Every shell command the documentation shows parses, nothing run: a renamed option, a deleted recipe or a
missing extra fails here, naming the page, the line and the command.

Read: the fenced ``bash`` / ``sh`` / ``shell`` / ``console`` blocks of README.md and docs/**/*.md (a block
without a language whose first line is a command fails, so it cannot escape the check). Lines continued
with ``\\`` are joined, comments dropped, ``&&`` / ``||`` / ``;`` / ``|`` chains split, ``$`` prompts,
``VAR=value`` prefixes and ``sudo`` / ``srun`` / ``torchrun`` wrappers taken off (torchrun's own options
parsed by torch's parser; the processes torchrun or srun start checked against the command's
``trainer.devices`` x ``trainer.num_nodes`` by Lightning's ``validate_settings``). A block with ``#SBATCH``
lines is an sbatch script, checked whole: ``bash -n``, its directives (before its first command, known
options, values) and its commands, srun's with the directives' nodes and tasks. Each command is then parsed
as it would be, from the repository's root:

- ``mae pretrain|finetune|detect|segment`` (also ``python train.py`` ..., ``python -m mae ...``): the
  command's LightningCLI parser and its own ``parse_arguments`` (``--config NAME`` resolved as a recipe,
  stacked configs, the linked keys), i.e. what ``--print_config`` checks, without printing or training;
- the other ``mae`` commands (also ``python -m mae <command>``): their parser, and the spellings removed in
  0.3.0 (``refuse_removed``);
- ``python benchmarks/<script>.py``: the script's argparse parser (its ``build_parser()``, or the parser its
  ``parse()`` builds, caught at ``parse_args`` so no check after parsing runs);
- ``pip install``: the extras named for this project exist in pyproject.toml;
- ``OTHER_TOOLS``: not checked; any other first word fails, so a new kind of command gets noticed.

Paths the reader supplies (checkpoints, data roots, ``runs/.../last.ckpt``) are not looked up: argument
parsing does not open them. Exemptions: a ``--config`` naming a YAML file the reader writes
(``READERS_CONFIGS``), which jsonargparse would load, is replaced by what the page says it holds
(``READERS_CONFIG_STAND_IN``); a block right under ``<!-- commands not checked: REASON -->`` (say, a mistake
shown on purpose) is skipped with that reason. Parsers are built once per command and reused (a jsonargparse /
argparse parser keeps no state between ``parse_args`` calls).
"""

import argparse
import contextlib
import importlib.util
import io
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parents[2]
SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "console"})
# Commands of other programs shown in the docs: their options are not ours to check.
OTHER_TOOLS = frozenset(
    {
        "apt",
        "apt-get",
        "cat",
        "cd",
        "chromium",
        "cp",
        "curl",
        "export",
        "git",
        "ls",
        "mkdir",
        "mkdocs",
        "mlflow",
        "nvidia-smi",
        "pytest",
        "ruff",
        "tee",
        "tensorboard",
        "wandb",
        "wget",
    }
)
OTHER_PYTHON_MODULES = frozenset({"pytest"})  # ``python -m X`` of another project
# ``--config FILE`` naming a YAML file the reader writes (docs/own-data.md): not shipped, so in its place what
# the page says such a file holds, a data section for the reader's image folder; the rest
# of the command is checked.
READERS_CONFIGS = frozenset({"my_scans.yaml"})
READERS_CONFIG_STAND_IN = ("--data", "mae.data.ImageFolderDataModule", "--data.root", "/data/my_scans")
# The root entry points: ``python <script> ...`` is ``mae <command> ...``.
LAUNCHERS = {"train.py": "pretrain", "finetune.py": "finetune"}
WRAPPERS = frozenset({"sudo", "srun"})  # run the command that follows their own options
PYTHONS = frozenset({"python", "python3"})
PROJECT_NAMES = frozenset({".", "./", "mae-lightning", "mae_lightning"})  # ``pip install <this>[extras]``
HELP_FLAGS = frozenset({"-h", "--help"})
CHAIN_OPERATORS = frozenset({"&&", "||", ";", "|", "&"})
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
LOOKS_LIKE_A_COMMAND = re.compile(r"^\s*(\$ |mae |python3? |pip |torchrun |srun )")
NOT_CHECKED = re.compile(r"<!--\s*commands not checked:\s*(?P<reason>\S.*?)\s*-->")  # the line above a block
# An sbatch script's directives (man sbatch), read up to its first command; the long options this test knows
# (a script using another gets it added here), those that take no value, and the variables SLURM sets from
# those Lightning checks.
SBATCH_DIRECTIVE = re.compile(r"#SBATCH\b(?P<options>.*)")
SBATCH_OPTIONS = frozenset(
    {
        "account",
        "array",
        "constraint",
        "cpus-per-task",
        "error",
        "exclusive",
        "gpus",
        "gpus-per-node",
        "gres",
        "job-name",
        "mail-type",
        "mail-user",
        "mem",
        "mem-per-cpu",
        "nodes",
        "no-requeue",
        "ntasks-per-node",
        "open-mode",
        "output",
        "partition",
        "qos",
        "requeue",
        "signal",
        "time",
    }
)
SBATCH_FLAGS = frozenset({"exclusive", "no-requeue", "requeue"})
# The shell's own words and SLURM's commands a script may use around its srun lines: not checked.
SCRIPT_WORDS = frozenset({"if", "then", "else", "elif", "fi", "exit", "[", "test", "echo", "scontrol"})
SLURM_VARIABLES = {
    "--nodes": "SLURM_NNODES",
    "-N": "SLURM_NNODES",
    "--ntasks-per-node": "SLURM_NTASKS_PER_NODE",
}
SIGNAL_SPEC = re.compile(r"(?:[RB]+:)?(?P<signal>[A-Za-z0-9]+)(?:@\d+)?")  # [{R|B}:]<sig_num>[@sig_time]


@dataclass(frozen=True)
class DocCommand:
    """One command of a page: ``where`` ("docs/pretraining.md:42", where it starts), its ``words`` (shlex's),
    ``text`` (the words quoted again), the ``problem`` when it could not even be read, and why it is
    ``not_checked`` when its block is marked so."""

    where: str
    words: tuple[str, ...]
    text: str
    problem: str | None = None
    not_checked: str | None = None

    @property
    def name(self) -> str:
        return f"{self.where} {' '.join(self.words[:3])}"[:70]


# ---------------------------------------------------------------------------------------- reading the pages


def doc_pages(root: Path) -> list[Path]:
    """README.md and every page under docs/, whichever exist."""
    readme = [root / "README.md"] if (root / "README.md").is_file() else []
    return readme + sorted((root / "docs").rglob("*.md"))


def fenced_blocks(text: str) -> Iterator[tuple[str, int, list[str], str]]:
    """(language, number of the block's first line, its lines, the line above its
    fence) of every fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        language = (opening["info"].strip().split() or [""])[0].lstrip("{.").rstrip("}").lower()
        body_start = i + 1
        i += 1
        while i < len(lines) and not re.fullmatch(rf"\s*{re.escape(fence[0])}{{{len(fence)},}}\s*", lines[i]):
            i += 1
        body = [line[indent:] if line[:indent].isspace() else line for line in lines[body_start:i]]
        yield language, body_start + 1, body, lines[body_start - 2] if body_start > 1 else ""
        i += 1


def without_comment(line: str) -> str:
    """``line`` up to its comment: a ``#`` that starts a word outside quotes (as the shell reads it)."""
    quote, escaped = None, False
    for position, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (position == 0 or line[position - 1] in " \t;&|("):
            return line[:position]
    return line


def logical_lines(lines: list[str], first_number: int, console: bool) -> Iterator[tuple[int, str]]:
    """(line number, text) of each command line: comments dropped, ``\\``-continued lines joined; in a
    ``console`` block only the ``$`` lines (the rest is output), elsewhere a ``$`` prompt taken off."""
    pending, start = "", 0
    for number, line in enumerate(lines, first_number):
        if not pending:
            prompt = re.match(r"\s*\$ ", line)
            if console and prompt is None:
                continue
            line, start = line[prompt.end() :] if prompt else line, number
        code = without_comment(line).rstrip()
        if code.endswith("\\") and not code.endswith("\\\\"):
            pending += code[:-1] + " "
            continue
        if (pending + code).strip():
            yield start, pending + code
        pending = ""
    if pending.strip():
        yield start, pending


def split_chain(text: str) -> list[list[str]]:
    """The simple commands of a command line (``a && b | c; d``), each as shlex's words, with the
    redirections taken out."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, ""
    commands: list[list[str]] = [[]]
    tokens = list(lexer)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in CHAIN_OPERATORS:
            commands.append([])
        elif (
            set(token) <= set("<>&") and token
        ):  # a redirection: it, its target and a file descriptor before it
            if commands[-1] and commands[-1][-1].isdigit():
                commands[-1].pop()
            i += 1
        else:
            commands[-1].append(token)
        i += 1
    return [words for words in commands if words]


def doc_commands(root: Path) -> list[DocCommand]:
    """Every command of the pages under ``root``, in page order."""
    found = []
    for page in doc_pages(root):
        relative = page.relative_to(root).as_posix()
        for language, first_number, lines, above in fenced_blocks(page.read_text(encoding="utf-8")):
            marked = NOT_CHECKED.fullmatch(above.strip())
            not_checked = marked["reason"] if marked else None
            if language == "" and lines and LOOKS_LIKE_A_COMMAND.match(lines[0]):
                problem = "a command in a block without a language: mark the block ```bash so it is checked"
                found.append(DocCommand(f"{relative}:{first_number}", (), lines[0].strip(), problem))
            if language not in SHELL_LANGUAGES or any(SBATCH_DIRECTIVE.match(line) for line in lines):
                continue  # an sbatch script is checked whole: ``sbatch_problems``
            for number, text in logical_lines(lines, first_number, console=language == "console"):
                where = f"{relative}:{number}"
                try:
                    chain = split_chain(text)
                except ValueError as err:  # shlex: an unclosed quote
                    found.append(
                        DocCommand(where, (), text.strip(), f"the shell cannot read it: {err}", not_checked)
                    )
                    continue
                for words in chain:
                    while words and ENV_ASSIGNMENT.match(words[0]):  # CUDA_VISIBLE_DEVICES=0 mae ...
                        words = words[1:]
                    if words:
                        found.append(DocCommand(where, tuple(words), shlex.join(words), None, not_checked))
    return found


# --------------------------------------------------------------------------------------- the parsers, once


@cache
def command_parser(name: str) -> Any:
    """The jsonargparse parser of command ``name`` (a training command's: its LightningCLI parser), raising
    instead of exiting."""
    from mae.cli.commands import BY_NAME

    parser = BY_NAME[name].build_parser()
    parser.exit_on_error = False
    return parser


@cache
def training_cli_classes() -> dict[str, type]:
    """Training command -> its LightningCLI class (whose ``parse_arguments`` resolves ``--config NAME``)."""
    from mae.cli.lightning import DenseCLI, DistillCLI, FinetuneCLI, PretrainCLI, SegmentCLI

    return {cli.command: cli for cli in (PretrainCLI, DistillCLI, FinetuneCLI, DenseCLI, SegmentCLI)}


@cache
def benchmark_parser(script: str) -> argparse.ArgumentParser:
    """The argparse parser of ``benchmarks/<script>``, from its ``build_parser()`` (nothing of it is run)."""
    path = REPO / "benchmarks" / script
    spec = importlib.util.spec_from_file_location(f"docs_commands_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "build_parser"):
        raise LookupError(
            f"benchmarks/{script} has no build_parser(): give it one, so its options can be checked"
        )
    return module.build_parser()


@cache
def project_extras() -> frozenset[str]:
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's TOML reader")
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return frozenset(project["optional-dependencies"])


# ---------------------------------------------------------------------------------------------- checking


def problem_with(words: list[str]) -> str | None:
    """Why the command ``words`` would not parse, or None."""
    program, args = words[0], list(words[1:])
    if program == "srun":
        return srun_problem(args, {})
    if program in WRAPPERS:  # the first word after their own options that names a program known here
        known = {"mae", "torchrun", "pip", *PYTHONS, *OTHER_TOOLS}
        inner = next((i for i, word in enumerate(args) if word in known), None)
        return f"{program} runs no command this test knows" if inner is None else problem_with(args[inner:])
    if program == "torchrun":
        return torchrun_problem(args)
    if program == "mae":
        return mae_problem(args)
    if program in PYTHONS:
        return python_problem(args)
    if program == "pip":
        return pip_problem(args)
    if program == "hf":
        return hf_problem(args)
    if program in OTHER_TOOLS:
        return None
    return f"unknown command {program!r}: check it in tests/docs/test_commands.py or add it to OTHER_TOOLS"


def torchrun_problem(args: list[str]) -> str | None:
    """``torchrun [its options] -m module ...`` or ``torchrun [its options] script.py ...``: torchrun's
    options by torch's own parser, the command it runs, and its processes (``--nnodes`` x
    ``--nproc-per-node``) against the command's ``trainer.num_nodes`` x ``trainer.devices``, as Lightning
    checks them at start-up."""
    from lightning.fabric.plugins.environments import TorchElasticEnvironment
    from torch.distributed.run import get_args_parser

    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages):
            options = get_args_parser().parse_args(args)
    except SystemExit:
        return f"torchrun: {messages.getvalue().strip().splitlines()[-1].split('error: ', 1)[-1]}"
    command = ["-m"] * options.module + [options.training_script, *options.training_script_args]
    problem = python_problem(command)
    if problem is None and str(options.nnodes).isdigit() and str(options.nproc_per_node).isdigit():
        world = {"WORLD_SIZE": str(int(options.nnodes) * int(options.nproc_per_node))}
        return processes_problem(["python", *command], world, TorchElasticEnvironment)
    return problem


def srun_problem(args: list[str], slurm: dict[str, str]) -> str | None:
    """``srun [its options] command ...``: the command, and its tasks (``--nodes``, ``--ntasks-per-node``:
    srun's own, else those of the script's ``#SBATCH`` lines, ``slurm``) against the command's
    ``trainer.num_nodes`` and ``trainer.devices``, as Lightning's ``SLURMEnvironment`` checks them."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    known = {"mae", "torchrun", "pip", *PYTHONS, *OTHER_TOOLS}
    inner = next((i for i, word in enumerate(args) if word in known), None)
    if inner is None:
        return "srun runs no command this test knows"
    slurm = {**slurm, **slurm_settings(args[:inner])}
    problem = problem_with(args[inner:])
    if problem is None and "SLURM_NNODES" in slurm and "SLURM_NTASKS_PER_NODE" in slurm:
        return processes_problem(args[inner:], slurm, SLURMEnvironment)
    return problem


def slurm_settings(options: list[str]) -> dict[str, str]:
    """The variables SLURM sets from the sbatch / srun ``options`` (``--nodes 2``, ``-N=2``,
    ``--ntasks-per-node=8``) that Lightning checks."""
    settings, i = {}, 0
    while i < len(options):
        name, _, value = options[i].partition("=")
        if not value and i + 1 < len(options) and not options[i + 1].startswith("-"):
            value, i = options[i + 1], i + 1
        if name in SLURM_VARIABLES:
            settings[SLURM_VARIABLES[name]] = value
        i += 1
    return settings


def processes_problem(words: list[str], environment: dict[str, str], cluster: type) -> str | None:
    """Whether the processes a launcher starts (``environment``: the variables it sets) agree with the
    training command ``words``' ``trainer.devices`` and ``trainer.num_nodes``, by the ``validate_settings``
    of Lightning's ``cluster`` environment; None for other commands and devices given otherwise than as
    a number."""
    command = training_command(words)
    if command is None:
        return None
    trainer = training_config(*command).trainer
    devices, nodes = str(trainer.devices), str(trainer.num_nodes)
    if not (devices.isdigit() and nodes.isdigit()):
        return None
    with mock.patch.dict(os.environ, environment):
        try:
            cluster().validate_settings(int(devices), int(nodes))
        except ValueError as err:
            return f"the launcher's processes and the command disagree: {err}"
    return None


def training_command(words: list[str]) -> tuple[str, list[str]] | None:
    """(command, arguments) of ``mae pretrain|finetune|detect|segment ...`` (also ``python -m mae ...``,
    ``python train.py ...``), else None."""
    if words[:1] and words[0] in PYTHONS:
        rest = words[1:]
        while rest and rest[0].startswith("-") and rest[0] != "-m":
            rest = rest[1:]  # the interpreter's own flags
        if rest[:1] and rest[0] in LAUNCHERS:
            words = ["mae", LAUNCHERS[rest[0]], *rest[1:]]
        elif rest[:2] == ["-m", "mae"]:
            words = rest[1:]
    words = [w for w in words if w != "--debug"]
    if words[:1] == ["mae"] and len(words) > 1 and words[1] in training_cli_classes():
        return words[1], words[2:]
    return None


def python_problem(args: list[str]) -> str | None:
    """``python -m module ...`` or ``python script.py ...``."""
    while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
        args = args[1:]  # the interpreter's own flags (-u, -O, ...)
    if args[:1] == ["-m"] and len(args) > 1:
        module, rest = args[1], args[2:]
        if module == "mae":
            return mae_problem(rest)
        if module == "pip":
            return pip_problem(rest)
        if module in OTHER_PYTHON_MODULES:
            return None
        return f"python -m {module}: not `python -m mae <command>`, and not in OTHER_PYTHON_MODULES"
    if not args or not args[0].endswith(".py"):
        return "python runs neither -m MODULE nor a script this test knows"
    script, rest = args[0], args[1:]
    if not (REPO / script).is_file():
        return f"no such script: {script}"
    if script in LAUNCHERS:
        return command_problem(LAUNCHERS[script], rest)
    if script.startswith("benchmarks/") and script.count("/") == 1:
        return benchmark_problem(script.removeprefix("benchmarks/"), rest)
    return f"python {script}: a script this test does not know how to parse"


def mae_problem(args: list[str]) -> str | None:
    """``mae <command> ...``, as ``mae.cli.main`` dispatches it."""
    from mae.cli.commands import BY_NAME
    from mae.cli.main import VERSION_FLAGS

    args = [a for a in args if a != "--debug"]
    if not args:
        return "mae without a command only prints its usage and exits 2"
    if args[0] in HELP_FLAGS or args[0] in VERSION_FLAGS:
        return None
    if args[0] not in BY_NAME:
        return f"unknown command {args[0]!r} (mae --help lists them)"
    return command_problem(args[0], args[1:])


def command_problem(name: str, argv: list[str]) -> str | None:
    """Command ``name`` of the ``mae`` table given ``argv``."""
    from mae.cli.commands import BY_NAME, TRAIN

    kept, i = [], 0
    while i < len(argv):  # a --config of the reader's own: the stand-in instead
        if argv[i] in ("--config", "-c") and argv[i + 1 : i + 2] and argv[i + 1] in READERS_CONFIGS:
            kept, i = kept + list(READERS_CONFIG_STAND_IN), i + 2
        elif argv[i].startswith(("--config=", "-c=")) and argv[i].split("=", 1)[1] in READERS_CONFIGS:
            kept, i = kept + list(READERS_CONFIG_STAND_IN), i + 1
        else:
            kept, i = kept + [argv[i]], i + 1
    if HELP_FLAGS & set(kept):
        return None  # the help is printed whatever else is given
    try:
        return training_problem(name, kept) if BY_NAME[name].group == TRAIN else options_problem(name, kept)
    except (Exception, SystemExit) as err:
        return f"{type(err).__name__}: {err}"


def training_problem(name: str, argv: list[str]) -> str | None:
    """``mae pretrain|finetune|detect|segment``: the parse of ``--print_config`` (the print left out)."""
    try:
        training_config(name, argv)
    except argparse.ArgumentError as err:
        return str(err)
    return None


def training_config(name: str, argv: list[str]) -> Any:
    """The configuration ``mae <name> *argv`` parses to (``--print_config``'s, without the print).

    Raises:
        argparse.ArgumentError: why it does not parse.
    """
    argv = [a for a in argv if a.split("=", 1)[0] != "--print_config"]
    cli = object.__new__(training_cli_classes()[name])  # only its parse_arguments runs: no model, no trainer
    cli.model_class = command_parser(name).groups["model"].group_class  # what it refuses renamed keys for
    cli.parse_arguments(command_parser(name), argv)
    return cli.config


def options_problem(name: str, argv: list[str]) -> str | None:
    """Every other command: its parser, and no spelling removed in 0.3.0 (``refuse_removed``)."""
    from mae.cli.command_options import refuse_removed

    parser = command_parser(name)
    try:
        refuse_removed(parser, argv)
        parser.parse_args(argv)
    except argparse.ArgumentError as err:
        return str(err)
    return None


def benchmark_problem(script: str, argv: list[str]) -> str | None:
    """``python benchmarks/<script> ...``: its argparse parser."""
    if HELP_FLAGS & set(argv):
        return None
    try:
        parser = benchmark_parser(script)
    except LookupError as err:
        return str(err)
    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages):
            parser.parse_args(argv)
    except SystemExit:
        return messages.getvalue().strip().splitlines()[-1]
    return None


def pip_problem(args: list[str]) -> str | None:
    """``pip install ...``: every extra named for this project (``.[dev,demo]``, ``-e ".[docs]"``) exists."""
    if args[:1] != ["install"]:
        return None
    for word in args[1:]:
        requirement = re.fullmatch(r"(?P<target>[^\[\]]+)\[(?P<extras>[^\]]*)\]", word)
        if requirement is None or requirement["target"].lower() not in PROJECT_NAMES:
            continue
        missing = sorted({e.strip() for e in requirement["extras"].split(",")} - project_extras())
        if missing:
            return (
                f"no extra {', '.join(missing)} in pyproject.toml "
                f"(extras: {', '.join(sorted(project_extras()))})"
            )
    return None


def hf_problem(args: list[str]) -> str | None:
    """``hf <command> ...`` (huggingface_hub's command, e.g. ``hf upload``): parsed by its own click parser,
    nothing run (no network)."""
    import click
    from huggingface_hub.cli.hf import app

    try:
        context = app.make_context("hf", list(args))
        name, command, rest = app.resolve_command(context, [*context.protected_args, *context.args])
        command.make_context(name, rest, parent=context)
    except click.ClickException as err:
        return err.format_message().splitlines()[0]
    return None


def problems_in(root: Path) -> list[str]:
    """Every command of the pages under ``root`` that does not parse, as "page:line: command: why"."""
    problems = []
    for command in doc_commands(root):
        if command.not_checked:
            continue
        problem = command.problem or problem_with(list(command.words))
        if problem is not None:
            problems.append(f"{command.where}: {command.text}: {problem}")
    return problems


@dataclass(frozen=True)
class SbatchScript:
    """A fenced shell block holding ``#SBATCH`` lines: ``where`` it starts ("docs/pretraining.md:42") and
    its ``lines``."""

    where: str
    lines: tuple[str, ...]


def sbatch_scripts(root: Path) -> list[SbatchScript]:
    """Every sbatch script of the pages under ``root``, in page order."""
    return [
        SbatchScript(f"{page.relative_to(root).as_posix()}:{first_number}", tuple(lines))
        for page in doc_pages(root)
        for language, first_number, lines, above in fenced_blocks(page.read_text(encoding="utf-8"))
        if language in SHELL_LANGUAGES and any(SBATCH_DIRECTIVE.match(line) for line in lines)
    ]


def sbatch_problems(script: SbatchScript) -> list[str]:
    """Why ``script`` would not run as shown: bash's syntax check (``bash -n``), its ``#SBATCH`` lines
    (only those before the first command are read by sbatch; options this test knows, a value where one is
    needed, a ``--signal`` that names a signal), its ``srun`` commands with the nodes and tasks the
    directives ask for, and its other commands as on any page (``SCRIPT_WORDS`` aside)."""
    page, first = script.where.rsplit(":", 1)
    syntax = subprocess.run(
        ["bash", "-n"], input="\n".join(script.lines) + "\n", capture_output=True, text=True, timeout=30
    )
    problems = [f"{script.where}: bash -n: {syntax.stderr.strip()}"] if syntax.returncode else []
    options: list[str] = []
    commands_started = False
    for number, line in enumerate(script.lines, int(first)):
        directive = SBATCH_DIRECTIVE.match(line)
        if directive and commands_started:
            problems.append(f"{page}:{number}: #SBATCH after the first command: sbatch ignores it")
        elif directive:
            words = shlex.split(directive["options"])
            options += words
            problems += [f"{page}:{number}: {p}" for p in map(sbatch_option_problem, words) if p]
        commands_started = commands_started or bool(without_comment(line).strip())
    for number, text in logical_lines(list(script.lines), int(first), console=False):
        for words in split_chain(text):
            while words and ENV_ASSIGNMENT.match(words[0]):
                words = words[1:]
            if not words or words[0] in SCRIPT_WORDS:
                continue
            if words[0] == "srun":
                problem = srun_problem(words[1:], slurm_settings(options))
            else:
                problem = problem_with(words)
            problems += [f"{page}:{number}: {shlex.join(words)}: {problem}"] if problem else []
    return problems


def sbatch_option_problem(word: str) -> str | None:
    """Why the directive's option ``word`` (``--nodes=2``, ``--requeue``) is wrong, or None."""
    name, equals, value = word.removeprefix("--").partition("=")
    if not word.startswith("--") or name not in SBATCH_OPTIONS:
        return f"{word}: not an sbatch long option this test knows (SBATCH_OPTIONS)"
    if (name in SBATCH_FLAGS) == bool(equals):
        return f"{word}: --{name} {'takes no value' if equals else 'needs a value: --' + name + '=VALUE'}"
    if name == "signal":
        spec = SIGNAL_SPEC.fullmatch(value)
        signal_name = spec and spec["signal"].upper().removeprefix("SIG")
        if not (signal_name and (signal_name.isdigit() or f"SIG{signal_name}" in signal.Signals.__members__)):
            return f"{word}: not [{{R|B}}:]SIGNAL[@SECONDS]"
    return None


# ------------------------------------------------------------------------------------------------- tests

DOC_COMMANDS = doc_commands(REPO)


@pytest.fixture
def at_the_repository_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs' commands are run from a clone's root: relative paths (configs/...) mean its files."""
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize("command", DOC_COMMANDS, ids=[command.name for command in DOC_COMMANDS])
def test_doc_command__parses(command: DocCommand, at_the_repository_root: None) -> None:
    if command.not_checked:
        pytest.skip(f"{command.where}: commands not checked: {command.not_checked}")
    problem = command.problem or problem_with(list(command.words))
    if problem is not None:
        pytest.fail(f"{command.where}: {command.text}: {problem}", pytrace=False)


SBATCH_SCRIPTS = sbatch_scripts(REPO)


@pytest.mark.parametrize("script", SBATCH_SCRIPTS, ids=[script.where for script in SBATCH_SCRIPTS])
def test_sbatch_script__runs_as_shown(script: SbatchScript, at_the_repository_root: None) -> None:
    problems = sbatch_problems(script)
    assert not problems, "\n".join(problems)


def test_sbatch_scripts__found_and_a_script_s_mistakes_are_named(tmp_path, at_the_repository_root) -> None:
    assert SBATCH_SCRIPTS, "no sbatch script on the pages"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "```bash\n"
        "#!/bin/bash\n"
        "#SBATCH --nodes=2 --ntasks-per-node=1\n"
        "#SBATCH --requeu\n"
        "#SBATCH --signal=B:USR3@90 --time\n"
        "if true; then\n"
        "srun python -m mae pretrain --config default --trainer.accelerator cpu --trainer.devices 1\n"
        "#SBATCH --requeue\n"
        "```\n"
    )
    [script] = sbatch_scripts(tmp_path)
    problems = sbatch_problems(script)
    expected = [
        "docs/page.md:2: bash -n: ",
        "docs/page.md:4: --requeu: not an sbatch long option",
        "docs/page.md:5: --signal=B:USR3@90: not [{R|B}:]SIGNAL[@SECONDS]",
        "docs/page.md:5: --time: --time needs a value",
        "docs/page.md:8: #SBATCH after the first command",
        "docs/page.md:7: srun python -m mae pretrain --config default --trainer.accelerator cpu "
        "--trainer.devices 1: the launcher's processes and the command disagree: You set `num_nodes=1` in "
        "Lightning, but the number of nodes configured in SLURM `--nodes=2` does not match",
    ]
    assert len(problems) == len(expected), "\n".join(problems)
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start), problem


def test_torchrun_options_and_processes_are_checked(at_the_repository_root) -> None:
    """torchrun's own options by torch's parser, its processes against the command's devices and nodes."""
    command = "-m mae pretrain --config default --trainer.accelerator cpu --trainer.devices 2"
    assert problem_with(shlex.split(f"torchrun --nnodes 2 --nproc-per-node 2 --node-rank 1 {command}")) == (
        "the launcher's processes and the command disagree: You set `devices=2` and `num_nodes=1` in "
        "Lightning, but the product (2 * 1) does not match the world size (4)."
    )
    assert problem_with(shlex.split(f"torchrun --nnodes 2 --nproc-per-node 2 --node-rnk 1 {command}")) == (
        "torchrun: unrecognized arguments: --node-rnk"
    )
    assert (
        problem_with(shlex.split(f"torchrun --nnodes 2 --nproc-per-node 2 {command} --trainer.num_nodes 2"))
        is None
    )


def test_doc_commands__found_on_the_pages():
    """Not vacuous: the pages' mae commands are found, on most pages."""
    mae_commands = [c for c in DOC_COMMANDS if c.words[:1] == ("mae",)]
    assert len(mae_commands) >= 40, [c.text for c in mae_commands]
    assert len({c.where.split(":")[0] for c in mae_commands}) >= 6
    shown = {c.words[1] for c in mae_commands}
    assert {"pretrain", "finetune", "detect", "segment", "knn", "probe", "export"} <= shown


def test_doc_commands__a_misspelt_option_a_deleted_recipe_and_other_mistakes_are_named(
    tmp_path, at_the_repository_root
):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n\n```bash\nmae pretrain --config default   # fine\n```\n")
    (tmp_path / "docs" / "page.md").write_text(
        "Text.\n\n"
        "```bash\n"
        "# a comment line\n"
        "CUDA_VISIBLE_DEVICES=0 mae pretrain --config defualt \\\n"
        "    --data.root /data/imagenet\n"
        "mae finetune --config default --model.chekpoint x.ckpt  # comment with 'quote\n"
        'pip install -e ".[dev,nosuch]" && mae export --checkpoint c.ckpt --format timm --out e.safetensors\n'
        "python benchmarks/throughput.py --configs cifar --steps-per-round 3\n"
        "frobnicate --now\n"
        "mae pretrian --config default\n"
        "mae knn --checkpoint '#not a comment' --data.class_path mae.data.DigitsDataModule | tee log\n"
        "```\n\n"
        "```\nmae pretrain --config default\n```\n\n"
        "```console\n$ python -m mae knn --checkpoint c.ckpt --data.class_path mae.data.NoSuchData\n"
        "error: ...\n```\n\n"
        "<!-- commands not checked: the error this page explains -->\n"
        "```bash\nmae pretrain --config default --model.img_size 64\n```\n"
    )
    problems = problems_in(tmp_path)
    expected = [
        "docs/page.md:5: mae pretrain --config defualt --data.root /data/imagenet: --config defualt: no "
        "such file, and no recipe of that name; did you mean default?",
        "docs/page.md:7: mae finetune --config default --model.chekpoint x.ckpt: ",
        "docs/page.md:8: pip install -e '.[dev,nosuch]': no extra nosuch in pyproject.toml",
        "docs/page.md:8: mae export --checkpoint c.ckpt --format timm --out e.safetensors: --format was "
        "renamed --checkpoint-format (the old spelling was removed in 0.3.0)",
        "docs/page.md:9: python benchmarks/throughput.py --configs cifar --steps-per-round 3: ",
        "docs/page.md:10: frobnicate --now: unknown command 'frobnicate'",
        "docs/page.md:11: mae pretrian --config default: unknown command 'pretrian'",
        "docs/page.md:16: mae pretrain --config default: a command in a block without a language",
        "docs/page.md:20: python -m mae knn --checkpoint c.ckpt --data.class_path mae.data.NoSuchData: ",
    ]
    assert len(problems) == len(expected), "\n".join(problems)
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start), problem
    assert (
        "model.chekpoint" in problems[1]
        and "--steps-per-round" in problems[4]
        and "NoSuchData" in problems[8]
    )
