"""The run folder's record of its tracked runs (``tracker.json``): what a resumed run reads to continue
them."""

import json
from pathlib import Path
from typing import Any

from mae.errors import InputError
from mae.io.atomic import atomic_write
from mae.training.trackers.base import tracker_named

TRACKER_FILE = "tracker.json"  # in the run folder: the tracked run a resume continues


def load_record(run_folder: Path) -> dict[str, dict]:
    """The record of ``run_folder`` (tracker name -> its entry; empty without one).

    Raises:
        InputError: ``tracker.json`` is not a record this tool wrote (not JSON, not an object of one object
            per tracker, a tracker's entry without what a resume reads), naming it; it is left as it is.
    """
    path = run_folder / TRACKER_FILE
    if not path.exists() and not path.is_symlink():
        return {}
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise _not_ours(path, str(err)) from None
    if not isinstance(record, dict) or not all(isinstance(entry, dict) for entry in record.values()):
        raise _not_ours(path, "a JSON object of one object per tracker expected")
    for name, entry in record.items():
        tracker = tracker_named(name)
        keys = tracker.record_keys if tracker is not None else ()  # another tracker's: kept as it is
        missing = [key for key in keys if not isinstance(entry.get(key), str)]
        if missing:
            raise _not_ours(path, f"its {name} entry has no {missing[0]}")
    return record


def _not_ours(path: Path, why: str) -> InputError:
    return InputError(
        f"{path}: not a tracker record this tool wrote ({why}); it is left as it is: move it away (a "
        "resumed run then starts a new tracked run), or use another run folder"
    )


def save_record(run_folder: Path, name: str, entry: dict[str, Any]) -> None:
    """Keep ``entry`` as tracker ``name``'s in the record of ``run_folder`` (the others' stay)."""
    record = load_record(run_folder) | {name: entry}
    atomic_write(run_folder / TRACKER_FILE, lambda tmp: tmp.write_text(json.dumps(record, indent=2) + "\n"))
