"""How every command ends on a user's mistake: the project's own message, alone, as the last line.

The project's errors name the file, key or value and the fix. Raised while jsonargparse builds the
data module or the model, they would reach the user inside its "Does not validate against any of
the Union subtypes ... Given value: Namespace(...)" wall and two tracebacks. ``run_command`` finds
the project's error in the exception chain and prints only its message, with exit status 2. A
failure that did not come from the project's checks (a bug, a library's error) keeps its traceback;
``--debug`` (or ``MAE_DEBUG=1``) keeps it for every error.

How a command is written (every one but the training commands, which are LightningCLI's): a
module with ``build_parser()`` (from ``command_parser``), ``run(args)``: one call to the layer that does
the work, with typed parameters or a settings dataclass (``settings_from``), never the ``Namespace``;
and ``main(argv=None)`` = ``parse_and_run(build_parser(), run, argv)``, with its row in
``mae.cli.commands``; the ``mae`` command (``mae.cli.main``) runs it through ``run_command``.
"""

import os
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

from jsonargparse import ArgumentParser, Namespace

from mae.cli.command_options import CommandHelpFormatter, finish_shared, refuse_removed
from mae.errors import INTERRUPTED_EXIT_CODE, USAGE_ERROR_EXIT_CODE, UsageError, UserError

DEBUG_FLAG = "--debug"
DEBUG_VARIABLE = "MAE_DEBUG"
# Packages whose errors wrap the project's (a data module's check raised while jsonargparse builds it).
PARSER_PACKAGES = ("jsonargparse", "argparse")
T = TypeVar("T")


def command_parser(prog: str, description: str) -> ArgumentParser:
    """The parser of a command: jsonargparse's (argparse's ``add_argument``, positionals, ``nargs``,
    ``choices``, flags and groups as in argparse, plus typed and class arguments and ``--config``)."""
    return ArgumentParser(prog=prog, description=description, formatter_class=CommandHelpFormatter)


def parse_and_run(
    parser: ArgumentParser,
    run: Callable[[Namespace], Any],
    argv: list[str] | None = None,
    instantiate: bool = False,
) -> Any:
    """Parse ``argv`` (None: ``sys.argv[1:]``), check the shared options (``finish_shared``), build the
    class arguments when ``instantiate`` (e.g. a ``--data.class_path`` data module), and return
    ``run(args)``; a ``UsageError`` raised on the way exits as a parser error."""
    argv = sys.argv[1:] if argv is None else list(argv)
    refuse_removed(parser, argv)
    args = parser.parse_args(argv)
    try:
        args = finish_shared(args)
        return run(parser.instantiate_classes(args) if instantiate else args)
    except UsageError as err:
        parser.error(str(err))


def settings_from(settings_class: type[T], args: Namespace, **given: Any) -> T:
    """A settings dataclass of the layer that does a command's work, from the parsed ``args``: each field
    from the argument of its name (a flag's ``dest``), or from ``given``; a field neither holds keeps its
    default."""
    values = {f.name: args[f.name] for f in fields(settings_class) if f.name in args}
    return settings_class(**{**values, **given})


def run_command(main: Callable[[], Any]) -> Any:
    """Run an entry point's ``main()``; an error the user can fix (``mae.errors.UserError``: a setting, an
    input, an output that would replace what the command did not write, a full device, unreachable
    storage) ends it with its message on stderr and exit status 2; any other error keeps its traceback
    (exit status 1). ``--debug`` is taken out of ``sys.argv`` and passed on as ``MAE_DEBUG=1`` (which the
    other processes of a multi-GPU run inherit)."""
    if DEBUG_FLAG in sys.argv[1:]:
        sys.argv = [sys.argv[0], *(a for a in sys.argv[1:] if a != DEBUG_FLAG)]
        os.environ[DEBUG_VARIABLE] = "1"
    try:
        return main()
    except Exception as err:
        project_error = None if os.environ.get(DEBUG_VARIABLE) == "1" else own_error(err)
        if project_error is None:
            raise
        print(f"error: {project_error}", file=sys.stderr, flush=True)
        sys.exit(USAGE_ERROR_EXIT_CODE)
    except KeyboardInterrupt:  # Ctrl-C: no traceback of wherever it came
        print("interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        sys.exit(INTERRUPTED_EXIT_CODE)
    finally:
        close_process_group()


def close_process_group() -> None:
    """Destroy the DDP process group a run left open (Lightning leaves it to the caller). At interpreter
    exit, an open gloo group's threads could be torn down joinable, aborting a finished run with
    "terminate called without an active exception" (seen once in 2-process CPU DDP), so the scheduler
    saw a failure; PyTorch asks for ``destroy_process_group()`` before exit."""
    distributed = sys.modules.get("torch.distributed")  # a command that never imported torch has none
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()


def own_error(err: BaseException) -> BaseException | None:
    """``err`` when it is a ``UserError``; else the ``UserError`` a parser's wrapping error holds (the error
    it was raised from or while handling: jsonargparse's "Does not validate" wall holds the data module's
    error there), or None. Only a parser's errors are looked through: a bug raised while handling a user's
    mistake is still a bug, and keeps its traceback."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, UserError):
            return err
        if not _raised_by_a_parser(err):
            return None
        err = err.__cause__ or err.__context__
    return None


def _raised_by_a_parser(err: BaseException) -> bool:
    """Whether ``err`` was raised inside jsonargparse or argparse (the code that wraps our errors)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    return module.split(".")[0] in PARSER_PACKAGES
