"""What a command may write, checked before it does any work: one rule for every command's outputs.

A command replaces only what a run of its own wrote, recognised by the record that output carries (an
index's metadata, a figure's PNG text, an export's sidecar, a folder's ``OUTPUT_RECORD``); anything
else at an output path is refused, named. So are an output inside one of the command's inputs (a
second run would read it as input), a folder where a file is meant and a file where a folder is
meant, and a location the user cannot write. Every refusal is an ``OutputError`` naming the option
and the path, raised before any image is read or any model loaded.
"""

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mae.errors import ConfigError

# A folder a command writes into holds this record (written first), which makes the folder its own.
OUTPUT_RECORD = ".mae_output.json"
# The PNG text key of a figure a command wrote: its value is the command's name.
PNG_KEY = "mae-command"


class OutputError(ConfigError):
    """An output a command may not write; the message names the option, the path and what to do."""


@dataclass(frozen=True)
class Output:
    """One path a command writes.

    Attributes:
        path: the file or folder.
        option: how the user named it (``--out``), or what it is beside (``beside --out``).
        kind: "file" or "folder".
        ours: recognises what a run of this command wrote at ``path`` (an existing file or a non-empty
            folder); a folder's default is its ``OUTPUT_RECORD``.
    """

    path: Path
    option: str
    kind: Literal["file", "folder"] = "file"
    ours: Callable[[Path], bool] | None = None


def check_outputs(command: str, outputs: Iterable[Output], inputs: Iterable[str | Path] = ()) -> None:
    """Refuse any of ``outputs`` that ``command`` may not write (see the module's rule).

    Raises:
        OutputError: naming the option, the path and the fix.
    """
    resolved_inputs = [Path(os.path.realpath(p)) for p in inputs]
    for out in outputs:
        try:
            _check_output(command, out, Path(out.path), resolved_inputs)
        except PermissionError as err:  # a folder on the way that this user may not look into
            raise OutputError(
                f"{out.option} {out.path}: cannot look at {err.filename or out.path} ({err.strerror}); "
                "choose a folder you can read and write"
            ) from None


def _check_output(command: str, out: Output, path: Path, resolved_inputs: list[Path]) -> None:
    _check_not_an_input(out, path, resolved_inputs)
    _check_place(out, path)
    if out.kind == "folder" and path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"{out.option} {path} is not writable by this user; choose a folder you can write")
    if out.kind == "file" and path.is_dir():
        raise OutputError(f"{out.option} {path} is a folder; give a file path (the folder is left as it is)")
    if out.kind == "folder" and path.exists() and not path.is_dir():
        raise OutputError(f"{out.option} {path} is a file; give a folder path (the file is left as it is)")
    if _holds_something(path) and not (out.ours or _folder_is_ours(command))(path):
        what, name = ("a file" if out.kind == "file" else "files"), spoken(command)
        raise OutputError(
            f"{out.option} {path} holds {what} that no run of {name} wrote{_listing(path)}; choose "
            f"another path, or move it away: {name} replaces only its own outputs"
        )


def spoken(command: str) -> str:
    """A command's record id as a user types the command: ``mae.embed`` -> ``mae embed``. The ids in the
    records stay as earlier runs wrote them, so their outputs stay recognised."""
    return f"mae {command.rsplit('.', 1)[-1]}"


def _check_not_an_input(out: Output, path: Path, inputs: list[Path]) -> None:
    target = Path(os.path.realpath(path))
    for source in inputs:
        if target == source or (source.is_dir() and target.is_relative_to(source)):
            raise OutputError(
                f"{out.option} {path} is inside the input {source}, where a later run would read it "
                f"as input (or it would replace an input); write it outside {source}"
            )


def _check_place(out: Output, path: Path) -> None:
    """The nearest existing folder above ``path`` must be a folder the user can write."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        if parent.is_symlink():  # a dangling link: nothing can be created below it
            break
        parent = parent.parent
    if (parent.exists() and not parent.is_dir()) or (parent.is_symlink() and not parent.exists()):
        raise OutputError(
            f"{out.option} {path}: {parent} is not a folder, so nothing can be written below it"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(
            f"{out.option} {path}: {parent} is not writable by this user; choose a folder you can write"
        )


def _holds_something(path: Path) -> bool:
    if path.is_dir():
        return any(path.iterdir())
    return path.exists() or path.is_symlink()


def _listing(path: Path) -> str:
    if not path.is_dir():
        return ""
    names = sorted(p.name for p in path.iterdir())
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f" ({shown})"


def _folder_is_ours(command: str) -> Callable[[Path], bool]:
    def ours(folder: Path) -> bool:
        return folder.is_dir() and read_record(folder).get("command") == command

    return ours


def read_record(folder: Path) -> dict:
    """The ``OUTPUT_RECORD`` of ``folder`` ({} when there is none or it is not ours)."""
    try:
        record = json.loads((folder / OUTPUT_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def claim_folder(folder: Path, command: str) -> None:
    """Make ``folder`` (created if missing) the output folder of ``command``: its ``OUTPUT_RECORD``."""
    from mae.io.atomic import atomic_write

    folder.mkdir(parents=True, exist_ok=True)
    if read_record(folder).get("command") != command:
        atomic_write(
            folder / OUTPUT_RECORD, lambda tmp: tmp.write_text(json.dumps({"command": command}) + "\n")
        )


def png_is_from(command: str) -> Callable[[Path], bool]:
    """Recognises a PNG figure ``command`` wrote (its ``PNG_KEY`` text, see ``png_info``)."""

    def ours(path: Path) -> bool:
        from PIL import Image

        try:
            with Image.open(path) as image:
                return image.format == "PNG" and image.info.get(PNG_KEY) == command
        except (OSError, ValueError, Image.DecompressionBombError):
            return False

    return ours


def png_info(command: str):
    """The ``pnginfo`` that marks a PNG as written by ``command`` (``image.save(..., pnginfo=...)``)."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text(PNG_KEY, command)
    return info
