"""The run folder's record of its tracked runs (``tracker.json``): what a resumed run reads to continue
them."""

import json
from pathlib import Path
from typing import Any

from mae.errors import ConfigError
from mae.io.atomic import atomic_write

TRACKER_FILE = "tracker.json"  # in the run folder: the tracked run a resume continues


def load_record(run_folder: Path) -> dict[str, dict]:
    """The record of ``run_folder`` (tracker name -> its entry; empty without one)."""
    path = run_folder / TRACKER_FILE
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{path}: not the tracker record this tool writes ({err}); move it away to start a new tracked "
            "run"
        ) from None
    return record if isinstance(record, dict) else {}


def save_record(run_folder: Path, name: str, entry: dict[str, Any]) -> None:
    """Keep ``entry`` as tracker ``name``'s in the record of ``run_folder`` (the others' stay)."""
    record = load_record(run_folder) | {name: entry}
    atomic_write(run_folder / TRACKER_FILE, lambda tmp: tmp.write_text(json.dumps(record, indent=2) + "\n"))
