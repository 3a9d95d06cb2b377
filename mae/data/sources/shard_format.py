"""What the shard tool writes and the streaming data module reads: the format's name and version;
``mae_shards.json``, the record written last, whose absence marks an unfinished conversion; and
``mae_shards.partial.json``, the record of a conversion under way (or killed part-way)."""

import json
import re
from pathlib import Path
from typing import Any

from mae.errors import InputError, MissingFileError
from mae.io import storage

FORMAT = "mae-shards"
VERSION = 1
METADATA = "mae_shards.json"
# Written before a conversion changes OUT, removed after METADATA: what it replaces and which split
# folders it writes, so that --overwrite can also clear a conversion that was interrupted.
PARTIAL = "mae_shards.partial.json"
# atomic_write's temporary file of either record, left (locally) by a kill during the record's write.
RECORD_TEMPORARY = re.compile(r"\.mae_shards(\.partial)?\.json\.tmp-\d+")


def is_record(data: Any) -> bool:
    """Whether ``data`` (a parsed METADATA or PARTIAL) is a record of this format."""
    return isinstance(data, dict) and data.get("format") == FORMAT


def is_record_temporary(name: str, text: str | None) -> bool:
    """Whether the file ``name`` (relative to OUT) holding ``text`` is a record's temporary file, left
    by a kill before its rename: atomic_write's name for it, and a record of this format as content,
    or none (a kill between creating the file and its single write of a few hundred bytes)."""
    if text is None or not RECORD_TEMPORARY.fullmatch(name):
        return False
    try:
        return not text or is_record(json.loads(text))
    except json.JSONDecodeError:
        return False


def unfinished_conversion(root: str, storage_options: dict | None = None) -> bool:
    """Whether ``root`` holds the record of a conversion of ``mae shard`` that stopped before
    writing METADATA: its PARTIAL, or, after a kill during that first write, its temporary file
    (local only: an S3 object is written whole)."""
    try:
        if is_record(storage.read_json(storage.join(root, PARTIAL), storage_options)):
            return True
    except ValueError:  # not JSON: not a record of ours
        return False
    if storage.is_remote(root):
        return False
    return any(
        is_record_temporary(p.name, p.read_text(errors="replace")) for p in Path(root).glob(".mae_shards*")
    )


def read_metadata(root: str, storage_options: dict | None = None) -> dict[str, Any]:
    """The ``mae_shards.json`` of a shard folder, checked: this format and version, a training split.

    Raises:
        FileNotFoundError: nothing at ``root``, or a folder that is not a finished shard folder
            (with what it looks like and the command that makes one, or finishes an unfinished one).
        ValueError: another format or version.
        storage.StorageError: an unreachable endpoint, missing bucket, or refused credentials.
    """
    make = f"write shards there with `mae shard IMAGE_FOLDER --out {root}`"
    if not storage.is_remote(root) and not storage.exists_any(root):
        raise MissingFileError(f"no shard folder at data.root={root} (missing or empty); {make}")
    metadata = storage.read_json(storage.join(root, METADATA), storage_options)
    if metadata is None:
        if not storage.exists_any(root, storage_options):
            raise MissingFileError(f"nothing is stored at data.root={root}; {make}")
        if storage.read_text(storage.join(root, "index.json"), storage_options) is not None:
            raise MissingFileError(
                f"data.root={root} is a litdata folder without {METADATA}: not written by mae shard (or "
                f"by a version before the format had one); {make}, or point data.root at the folder above "
                "its splits"
            )
        if unfinished_conversion(root, storage_options):
            raise MissingFileError(
                f"data.root={root} holds an unfinished conversion of mae shard: it stopped (killed or "
                f"failed) before writing {METADATA}, which it writes last; run it again with `mae shard "
                f"IMAGE_FOLDER --out {root} --overwrite`, which replaces exactly the files that conversion "
                "wrote"
            )
        raise MissingFileError(
            f"data.root={root} has no {METADATA} and no record of an unfinished conversion of mae shard "
            f"({PARTIAL}): not a shard folder, and the shard tool does not write over files it did not "
            "write; write shards to an empty folder or prefix with `mae shard IMAGE_FOLDER --out OUT` and "
            "set data.root to it"
        )
    if metadata.get("format") != FORMAT or metadata.get("version") != VERSION:
        raise InputError(
            f"{storage.join(root, METADATA)} is format {metadata.get('format')!r} version "
            f"{metadata.get('version')!r}; this code reads {FORMAT!r} version {VERSION}: reshard with `mae "
            "shard ... --overwrite`"
        )
    return metadata
