"""Writing files and folders so that a kill or a full disk never leaves a half-written one at the target
path: the free space checked before (``check_free_space``), a temporary file or folder beside the target,
renamed into place once whole (``atomic_write``, ``replace_folder``, ``write_folder_once``)."""

import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from mae.errors import InputError, UserError


class NoSpaceError(UserError, OSError):
    """A write that the device's free space cannot hold; names the file, its size and the free bytes."""

    def __init__(self, path: Path, needed: int | None, free: int, kept: str) -> None:
        need = f"it needs about {needed:,} bytes and " if needed else ""
        super().__init__(
            errno.ENOSPC,
            f"no space left on device: could not write {path}{kept}: {need}{path.parent} has {free:,} bytes "
            "free; free some space there or write to another folder",
        )


def check_free_space(path: Path, needed: int | None) -> None:
    """Refuse a write of ``needed`` bytes (None: not known, nothing checked) at ``path`` that the free space
    of its folder cannot hold, before anything is written; the folder is made when missing.

    Raises:
        NoSpaceError: naming ``path``, the bytes needed and free, and that what ``path`` holds is intact.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    if needed is not None and needed > free:
        raise NoSpaceError(path, needed, free, _kept(path))


def _kept(path: Path) -> str:
    """What an error says of ``path``'s present content, which a failed write leaves as it was."""
    if path.is_dir():
        return " (the previous folder there is intact)"
    return " (the previous file there is intact)" if path.exists() else ""


def atomic_write(path: str | Path, write: Callable[[Path], None], size: int | None = None) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, fsync it, then rename it to ``path``.

    The previous file at ``path`` stays intact until the rename; the temporary file is removed on
    any error. ``size``: the bytes the file will take, if known (checked against the free space
    before writing, and named when the device fills up).

    Raises:
        NoSpaceError: the device is (or would be) full: naming ``path``, the bytes needed and free.
            Libraries that write through their own streams (``torch.save``) report a full device as
            a ``RuntimeError`` ("unexpected pos ..."); that is recognised by the free space left.
        OSError: naming ``path`` (no permission, ...), the previous file left intact.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        check_free_space(path, size)
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except NoSpaceError:
        raise
    except (OSError, RuntimeError) as err:
        written = tmp.stat().st_size if tmp.exists() else 0
        tmp.unlink(missing_ok=True)
        if _device_full(err, path.parent, written):
            needed = max(size or 0, written) or None
            raise NoSpaceError(path, needed, shutil.disk_usage(path.parent).free, _kept(path)) from err
        if isinstance(err, RuntimeError):
            raise
        raise OSError(err.errno, f"could not write {path}{_kept(path)}: {err.strerror or err}") from err
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _device_full(err: BaseException, folder: Path, written: int) -> bool:
    """Whether a failed write failed because ``folder``'s device ran out of space: ENOSPC, or
    (for a writer that hides the errno) next to nothing free while the partial file held the rest."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return False
    return free - written < 64 * 1024  # before the partial file was removed


def replace_folder(new: Path, path: Path) -> None:
    """Put the finished folder (or file) ``new`` at ``path`` (beside it, on the same device), replacing what
    ``path`` holds (a folder or a file) only once ``new`` is whole: what is there is moved aside first and
    removed after the rename, so that a kill leaves the old content at ``path`` or beside it
    (``.<name>.old.tmp-<pid>``), or the new one at ``path``."""
    old = path.with_name(f".{path.name}.old.tmp-{os.getpid()}")
    if path.exists() or path.is_symlink():
        path.rename(old)
    new.rename(path)
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old)
    else:
        old.unlink(missing_ok=True)


def write_folder_once(
    root: Path, params: dict, record: str, what: str, write: Callable[[Path, dict], None]
) -> Path:
    """A generated folder (a built-in task) written whole, once: ``write(tmp, params)`` fills a temporary
    folder beside ``root``, which is renamed to ``root`` at the end, so a killed run leaves no half-written
    folder there. ``write`` writes ``tmp / record`` (the JSON of ``params``) last. A ``root`` that holds the
    folder of the same ``params`` is reused as it is, also when another process wrote it meanwhile.

    Raises:
        ValueError: ``root`` holds something else: ``what`` of other parameters (named), or files without
            ``record``; naming ``root`` and the fix.
    """
    if _holds(root, params, record, what):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp, params)
        try:
            os.rename(tmp, root)  # replaces an empty folder; fails on a non-empty one
        except OSError:
            if not _holds(
                root, params, record, what
            ):  # not another process that wrote the same folder meanwhile
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _holds(root: Path, params: dict, record: str, what: str) -> bool:
    """Whether ``root`` holds the folder of ``params`` (True), or nothing at all (False); anything else
    raises."""
    if not root.exists() or (root.is_dir() and not any(root.iterdir())):
        return False
    if not (root / record).is_file():
        raise InputError(
            f"{root} is not empty and holds no {what} (no {record}): write them to an empty or new folder, "
            f"or remove {root}"
        )
    written = json.loads((root / record).read_text())
    if written != params:
        changed = {k: (written.get(k), v) for k, v in params.items() if written.get(k) != v}
        raise InputError(
            f"{root} holds {what} written with other parameters ((written, asked): {changed}): point root at "
            f"another folder, or remove {root} to write them anew"
        )
    return True
