"""The errors a user can fix, by type: what ``mae.cli.command.run_command`` shows as one ``error:`` line
(exit status 2) instead of a traceback. Anything else a command raises is a bug or a library's failure
and keeps its traceback (exit status 1).

Each message names the file, key or value and what would be right. The families subclass the built-in
error a caller would expect (``ConfigError`` is a ``ValueError``, ``MissingFileError`` a
``FileNotFoundError``, ...), so ``except ValueError`` around a project call keeps working.
"""

from jsonargparse.typing import NonNegativeInt, OpenUnitInterval, PositiveFloat, PositiveInt

USAGE_ERROR_EXIT_CODE = 2  # a user's mistake, as argparse exits on a bad argument
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT: a command ended by Ctrl-C, as the shell reports it

# The ranges of jsonargparse's restricted number types, in the words of an error.
ALLOWED = {
    PositiveInt: "at least 1",
    NonNegativeInt: "at least 0",
    PositiveFloat: "above 0",
    OpenUnitInterval: "strictly between 0 and 1",
}


class UserError(Exception):
    """Base of every error the user can fix by changing a setting, an input or an output path."""


class UsageError(UserError):
    """A bad argument that only a command's ``run`` can see (e.g. against the loaded model): reported as
    the parser reports a bad flag (usage, ``error: <message>``, exit status 2)."""


class ConfigError(UserError, ValueError):
    """A setting (a config key, a command-line option or an argument of the Python API) whose value
    cannot work: names the key, the value given and what would be right."""


class InputError(UserError, ValueError):
    """An input file or folder that cannot be read as asked (an unreadable image, a checkpoint of another
    layout, a data folder of the wrong shape): names the file and what would be right."""


class MissingFileError(UserError, FileNotFoundError):
    """An input that does not exist: names the path and the setting that pointed at it."""


class OutputExistsError(UserError, FileExistsError):
    """An output that would replace what the command did not write: names the path; nothing is written."""


def check_at_least(
    setting: str, value: float, least: float, rule: str = "", error: type[UserError] = ConfigError
) -> None:
    """Raise ``error`` when ``value`` is under ``least``, in one wording: ``<setting> must be >= <least>
    (<rule>), got <value>`` (the parenthesis only with a ``rule``)."""
    if value < least:
        why = f" ({rule})" if rule else ""
        raise error(f"{setting} must be >= {least}{why}, got {value}")
