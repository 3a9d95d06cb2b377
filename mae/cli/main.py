"""The ``mae`` command: ``mae <command> [options]``, one subcommand per entry point (``mae.cli.commands``).

``mae --help`` is printed from the table alone, so it imports neither torch nor any command; the chosen
command's module is imported, then run as ``mae.cli.command.run_command`` runs every command (a project
error: ``error: ...`` and exit status 2). ``--debug`` (anywhere) keeps the traceback of every error.
"""

import difflib
import os
import sys
import textwrap

from mae.cli.commands import BY_NAME, COMMANDS

HELP_FLAGS = ("-h", "--help")
VERSION_FLAGS = ("-V", "--version")
BROKEN_PIPE_EXIT_CODE = 128 + 13  # as a shell reports a process ended by SIGPIPE


def usage() -> str:
    """``mae --help``: every subcommand with its one line, under its group."""
    width = max(len(command.name) for command in COMMANDS) + 2
    lines = [
        "usage: mae <command> [options]",
        "",
        "Masked Autoencoders (He et al., 2021): pretraining, fine-tuning and reuse of the encoder, on timm "
        "and Lightning.",
        "",
    ]
    groups = dict.fromkeys(command.group for command in COMMANDS)
    for group in groups:
        lines.append(f"{group}:")
        for command in (c for c in COMMANDS if c.group == group):
            wrapped = textwrap.wrap(command.summary, 100 - width - 2) or [""]
            lines.append(f"  {command.name:<{width}}{wrapped[0]}")
            lines += [f"  {'':<{width}}{rest}" for rest in wrapped[1:]]
        lines.append("")
    lines += [
        "options:",
        "  -h, --help     this list; mae <command> --help: the command's own options",
        "  -V, --version  the installed version",
        "  --debug        keep the full traceback of any error (or set MAE_DEBUG=1)",
        "",
        "Start with: mae pretrain --config default   (recipes: mae recipes)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> object:
    """Run ``mae`` with ``argv`` (default ``sys.argv[1:]``); returns what the
    subcommand's ``main`` returns."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in HELP_FLAGS:  # before any import: mae --help reads the table alone
        print(usage())
        return None
    from mae.cli.command import DEBUG_FLAG, DEBUG_VARIABLE, USAGE_ERROR_EXIT_CODE, run_command

    if DEBUG_FLAG in argv:
        argv = [a for a in argv if a != DEBUG_FLAG]
        os.environ[DEBUG_VARIABLE] = "1"  # the processes of a multi-GPU run inherit it
    if not argv or argv[0] in HELP_FLAGS:
        print(usage())
        return None if argv else sys.exit(USAGE_ERROR_EXIT_CODE)
    if argv[0] in VERSION_FLAGS:
        argv[0] = "version"
    name, rest = argv[0], argv[1:]
    if name not in BY_NAME:
        close = difflib.get_close_matches(name, BY_NAME, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        print(
            f"usage: mae <command> [options]\nmae: error: unknown command '{name}'{hint} (mae --help lists "
            "them)",
            file=sys.stderr,
        )
        sys.exit(USAGE_ERROR_EXIT_CODE)
    return run_command(lambda: invoke(name, rest))


def invoke(command: str, argv: list[str] | None = None) -> object:
    """``mae <command> <argv>`` in this process, for Python callers and tests: the subcommand's ``main``,
    with what it raises left raised (``main`` turns a ``mae.errors.UserError`` into an ``error:`` line).

    Raises:
        KeyError: ``command`` is not one of ``mae.cli.commands.COMMANDS``.
    """
    return BY_NAME[command].load()(list(argv or []))


def console_main() -> None:
    """The ``mae`` console script: ``main()``, exiting 0 whatever the command returned. A reader that stops
    early (``mae recipes --show default | head``) ends the command quietly with the shell's status for a
    closed pipe (141), not a ``BrokenPipeError`` traceback."""
    try:
        main()
        sys.stdout.flush()  # inside the try: a closed pipe is found when the buffer is written
    except BrokenPipeError:
        # Python would fail again flushing stdout at exit: point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(BROKEN_PIPE_EXIT_CODE)
