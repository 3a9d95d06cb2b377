"""What the shard tool writes and the streaming data module reads: the format's name and version,
and ``mae_shards.json``, the record written last, whose absence marks an unfinished conversion."""

from typing import Any

from mae.io import storage

FORMAT = "mae-shards"
VERSION = 1
METADATA = "mae_shards.json"


def read_metadata(root: str, storage_options: dict | None = None) -> dict[str, Any]:
    """The ``mae_shards.json`` of a shard folder, checked: this format and version, a training split.

    Raises:
        FileNotFoundError: nothing at ``root``, or a folder that is not a finished shard folder
            (with what it looks like and the command that makes one).
        ValueError: another format or version.
        storage.StorageError: an unreachable endpoint, missing bucket, or refused credentials.
    """
    make = f"write shards there with `python -m mae.data.shard IMAGE_FOLDER {root}`"
    if not storage.is_remote(root) and not storage.exists_any(root):
        raise FileNotFoundError(f"no shard folder at data.root={root} (missing or empty); {make}")
    metadata = storage.read_json(storage.join(root, METADATA), storage_options)
    if metadata is None:
        if not storage.exists_any(root, storage_options):
            raise FileNotFoundError(f"nothing is stored at data.root={root}; {make}")
        if storage.read_text(storage.join(root, "index.json"), storage_options) is not None:
            raise FileNotFoundError(
                f"data.root={root} is a litdata folder without {METADATA}: not written by mae.data.shard (or by "
                f"a version before the format had one); {make}, or point data.root at the folder above its splits"
            )
        raise FileNotFoundError(
            f"data.root={root} has no {METADATA}: an unfinished conversion (it is written last) or not a shard "
            f"folder; {make} --overwrite"
        )
    if metadata.get("format") != FORMAT or metadata.get("version") != VERSION:
        raise ValueError(
            f"{storage.join(root, METADATA)} is format {metadata.get('format')!r} version {metadata.get('version')!r};"
            f" this code reads {FORMAT!r} version {VERSION}: reshard with `python -m mae.data.shard ... --overwrite`"
        )
    return metadata
