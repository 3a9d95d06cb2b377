"""Where a conversion writes (``mae shard ... --out OUT``): what an earlier conversion left
there, by its own records, so that ``--overwrite`` deletes exactly that and nothing a user put
there; and a private workspace for litdata's caches, so concurrent conversions never share one, which
the next conversion removes when a kill left it behind."""

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mae.data.sources.shard_format import (
    FORMAT,
    METADATA,
    PARTIAL,
    RECORD_TEMPORARY,
    is_record,
    is_record_temporary,
)
from mae.errors import InputError, OutputExistsError
from mae.io import storage

# A shard file (litdata "chunk") as an index.json lists it.
CHUNK_FILE = re.compile(r"chunk-\d+-\d+\.bin")
# Any file or object name litdata's converter writes into a split folder: shards; each worker's
# ``{rank}.index.json`` (written into the output folder itself when it is local) and the per-node
# ``{node}-index.json``, which it merges into ``index.json`` through ``index.json.tmp``. A kill
# part-way leaves any of them.
LITDATA_FILE = re.compile(r"chunk-\d+-\d+\.bin|(\d+[.-])?index\.json(\.tmp)?")


def conversion_files(out: str, storage_options: dict | None) -> tuple[list[str], set[str]]:
    """What is stored at ``out`` and which of it earlier conversions of this tool wrote, by their
    records: ``METADATA`` and, for each split folder it names, ``index.json`` and the chunk files
    listed in it; an unfinished conversion's ``PARTIAL`` record, the files it was replacing and the
    litdata files (``LITDATA_FILE``) in the split folders it was writing; and the records' temporary
    files, by their content (``is_record_temporary``).

    Returns:
        (every file or object under ``out``, relative to it; the subset this tool wrote).
    """
    stored = storage.list_files(out, storage_options)
    present = set(stored)
    owned: set[str] = set()
    metadata = _record(out, METADATA, present, storage_options)
    if metadata is not None:
        owned.add(METADATA)
        owned |= _split_files(out, metadata.get("split_folders", metadata.get("splits", {})), storage_options)
    # A record's temporary file is ours by its content: also the one a kill during the very first
    # write leaves alone, before any record names it.
    owned |= {f for f in present if is_record_temporary(f, _small_text(out, f, storage_options))}
    partial = _record(out, PARTIAL, present, storage_options)
    if partial is not None:
        owned |= {PARTIAL, METADATA} | {f for f in partial.get("files", []) if isinstance(f, str)}
        owned |= _unfinished_split_files(present, partial.get("splits", []))
    return stored, owned & present


def _record(out: str, name: str, present: set[str], storage_options: dict | None) -> dict | None:
    """The record ``out/name`` (``METADATA`` or ``PARTIAL``) when it is there and one of this tool's."""
    record = storage.read_json(storage.join(out, name), storage_options) if name in present else None
    return record if is_record(record) else None


def _split_files(out: str, splits: Any, storage_options: dict | None) -> set[str]:
    """The files a finished conversion wrote in its split folders: each one's ``index.json`` and the chunk
    files it lists."""
    owned = set()
    for split in filter(_plain_folder, splits):
        index = storage.read_json(storage.join(out, split, "index.json"), storage_options)
        if isinstance(index, dict):
            owned.add(f"{split}/index.json")
            chunks = [c.get("filename") for c in index.get("chunks", []) if isinstance(c, dict)]
            owned |= {f"{split}/{n}" for n in chunks if isinstance(n, str) and CHUNK_FILE.fullmatch(n)}
    return owned


def _unfinished_split_files(present: set[str], splits: Any) -> set[str]:
    """The litdata files (``LITDATA_FILE``) in the split folders an unfinished conversion was writing."""
    return {
        f
        for split in filter(_plain_folder, splits)
        for f in present
        if f.startswith(split + "/") and LITDATA_FILE.fullmatch(f[len(split) + 1 :])
    }


def _small_text(out: str, name: str, storage_options: dict | None) -> str | None:
    """The text of ``out/name`` when its name is a record's temporary (records are small), else None
    (also for a file of that name that is not text: not a record)."""
    if not RECORD_TEMPORARY.fullmatch(name):
        return None
    try:
        return storage.read_text(storage.join(out, name), storage_options)
    except UnicodeDecodeError:
        return None


def _plain_folder(name: Any) -> bool:
    """A relative folder name that stays below OUT (a split name read from a record)."""
    return isinstance(name, str) and bool(name) and not name.startswith("/") and ".." not in name.split("/")


def check_destination(root: Path, out: str, overwrite: bool, storage_options: dict | None) -> list[str]:
    """Refuse an ``out`` this conversion may not write, and return what ``--overwrite`` must delete
    there: exactly the files an earlier conversion wrote (``conversion_files``).

    Raises:
        FileExistsError: ``out`` is a file; holds files no conversion wrote (naming them, whatever
            ``overwrite``); or holds an earlier conversion and ``overwrite`` is off.
        ValueError: ``out`` is inside ``root``, where the next listing of ``root`` would read it.
    """
    if not storage.is_remote(out):
        if Path(out).is_file():
            raise OutputExistsError(f"{out} is a file; give a folder (or an s3:// URL) for the shards")
        source, target = Path(os.path.realpath(root)), Path(os.path.realpath(out))
        if target.is_relative_to(source):
            raise InputError(
                f"the output folder {out} is inside the dataset folder {root}, where it would be read as "
                f"images or a class by the next conversion or training run; choose a folder outside "
                f"{root}"
            )
    stored, owned = conversion_files(out, storage_options)
    foreign = [f for f in stored if f not in owned]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputExistsError(
            f"{out} is not empty: it holds {len(foreign)} file(s) that no conversion of this "
            f"tool wrote there ({shown}); choose an empty folder or prefix, or move them "
            "away"
        )
    if stored and not overwrite and METADATA not in stored:
        raise OutputExistsError(
            f"{out} is not empty: it holds the {len(stored)} file(s) of an unfinished "
            f"conversion of this tool (by its records: killed or failed before it wrote {METADATA}, "
            "which it writes last); pass --overwrite to replace exactly them with a new conversion, "
            "or choose an empty folder or prefix"
        )
    if stored and not overwrite:
        raise OutputExistsError(
            f"{out} is not empty: it holds the {len(stored)} file(s) of an earlier conversion "
            f"(named in its {METADATA} and index.json files); pass --overwrite to replace them, or "
            f"choose an empty folder or prefix"
        )
    return stored


def clear_destination(out: str, earlier: list[str], splits: list[str], storage_options: dict | None) -> None:
    """Record this conversion in ``PARTIAL``, then delete ``earlier`` (an earlier conversion's files),
    its ``METADATA`` first: until the new one is written, ``out`` reads as an unfinished conversion."""
    record = {"format": FORMAT, "files": sorted(set(earlier) - {PARTIAL}), "splits": splits}
    storage.write_json(storage.join(out, PARTIAL), record, storage_options)
    storage.delete(storage.join(out, METADATA), storage_options)
    storage.delete_files(out, [f for f in earlier if f not in (PARTIAL, METADATA)], storage_options)


# litdata's converter caches (shards before upload, downloaded inputs): {variable: our sub-folder}.
LITDATA_CACHES = {"DATA_OPTIMIZER_CACHE_FOLDER": "chunks", "DATA_OPTIMIZER_DATA_CACHE_FOLDER": "data"}


WORKSPACE_PREFIX = "mae-shard-"
# The record in each workspace of who made it: {"format", "pid", "machine", "folders"} (``_write_owner``).
OWNER_RECORD = ".mae-shard-owner.json"
OWNER_FORMAT = "mae-shard-workspace"
# The name of a cache folder a workspace makes in a folder the user chose for litdata's caches.
CACHE_FOLDER = re.compile(rf"{WORKSPACE_PREFIX}({'|'.join(LITDATA_CACHES.values())})-[^/]+")


@contextmanager
def private_workspace() -> Iterator[str]:
    """A temporary folder for one conversion, removed at the end: the workers' kinds notes, and
    litdata's caches. litdata otherwise uses the fixed ``TMPDIR/chunks`` and ``TMPDIR/data`` (and
    empties them at each start), which concurrent conversions would share; a folder the user chose
    with litdata's variables becomes the parent of ours.

    A conversion killed outright (SIGKILL, out of memory) cannot remove its workspace: each one records
    its owner (``OWNER_RECORD``: this process and machine, and the cache folders it made elsewhere), and
    every conversion first removes the workspaces whose owner no longer runs (``remove_abandoned``)."""
    chosen = {name: os.environ.get(name) for name in LITDATA_CACHES}
    remove_abandoned(tempfile.gettempdir())
    with tempfile.TemporaryDirectory(prefix=WORKSPACE_PREFIX) as work:
        _write_owner(work, [])
        private = {}
        for name, sub in LITDATA_CACHES.items():
            os.makedirs(chosen[name] or work, exist_ok=True)
            private[name] = os.path.abspath(
                tempfile.mkdtemp(prefix=f"{WORKSPACE_PREFIX}{sub}-", dir=chosen[name] or work)
            )
            # recorded at once (a kill just before leaves this one folder, not one of another's)
            _write_owner(work, [p for p in private.values() if not Path(p).is_relative_to(work)])
        os.environ.update(private)  # read by litdata here and in the workers it starts
        try:
            yield work
        finally:
            for name, value in chosen.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            for folder in private.values():
                shutil.rmtree(folder, ignore_errors=True)


def remove_abandoned(parent: str) -> list[str]:
    """Remove the workspaces of conversions that were killed (``private_workspace``): the folders
    ``parent/mae-shard-*`` whose ``OWNER_RECORD`` names a process of this machine (same host name, boot
    and process namespace) that no longer runs, with the cache folders the record lists elsewhere. A
    folder without a readable record of ours, one of another machine (or boot, or container: its process
    ids are not this one's) and one whose process runs are left alone.

    Returns:
        The folders removed.
    """
    removed = []
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(WORKSPACE_PREFIX)]
    except OSError:  # no TMPDIR to look in: nothing of ours there
        return removed
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        owner = _read_owner(entry.path)
        if owner is None or owner["machine"] != _machine() or _running(owner["pid"]):
            continue
        for folder in [*owner["folders"], entry.path]:
            shutil.rmtree(folder, ignore_errors=True)  # another user's, in a shared TMPDIR, stays
            if not os.path.lexists(folder):
                removed.append(folder)
    return removed


def _write_owner(work: str, folders: list[str]) -> None:
    """Record in ``work`` that this process owns it and the cache ``folders`` made outside it, replacing
    the record whole (``os.replace``): a reader sees the old record or the new one."""
    record = {"format": OWNER_FORMAT, "pid": os.getpid(), "machine": _machine(), "folders": folders}
    temporary = os.path.join(work, f"{OWNER_RECORD}.tmp")
    with open(temporary, "w") as f:
        json.dump(record, f)
    os.replace(temporary, os.path.join(work, OWNER_RECORD))


def _read_owner(work: str) -> dict | None:
    """``work``'s owner record when it is one of ours, whole and well-formed (a positive integer pid;
    cache folders whose names are our sub-folders'), else None."""
    try:
        with open(os.path.join(work, OWNER_RECORD)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not (
        isinstance(record, dict)
        and record.get("format") == OWNER_FORMAT
        and type(record.get("pid")) is int
        and record["pid"] > 0  # os.kill(0 or -1, ...) would reach a whole process group
        and isinstance(record.get("machine"), str)
        and isinstance(record.get("folders"), list)
        and all(
            isinstance(f, str)
            and os.path.isabs(f)
            and CACHE_FOLDER.fullmatch(os.path.basename(f)) is not None
            for f in record["folders"]
        )
    ):
        return None
    return record


def _machine() -> str:
    """This machine, boot and process namespace, as far as the system tells (Linux: the host name, the
    kernel's boot id and the process-id namespace): where a recorded process id means this process."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return " ".join(parts)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists (running, stopped or not yet reaped) on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True
