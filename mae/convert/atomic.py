"""Writing files so that a kill or a full disk never leaves a half-written one at the target path."""

import os
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, fsync it, then rename it to ``path``.

    The previous file at ``path`` stays intact until the rename; the temporary file is removed on
    any error.

    Raises:
        OSError: naming ``path`` (a full disk, no permission, ...), the previous file left intact.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        kept = " (the previous file there is intact)" if path.exists() else ""
        raise OSError(err.errno, f"could not write {path}{kept}: {err.strerror or err}") from err
    finally:
        tmp.unlink(missing_ok=True)
    return path
