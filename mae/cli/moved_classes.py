"""Class paths of modules that moved (``mae.training.settings.MOVES``), refused before jsonargparse parses:
a config written for 0.1 or 0.2 (``class_path: mae.dense.detection_data.DigitScenesDataModule``) would get
jsonargparse's list of union subtypes and import errors; it gets one line naming the file, the key, the old
path and the new one, as a renamed key does (``mae.training.settings.renamed_key_error``)."""

import importlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from mae.errors import ConfigError
from mae.training.settings import MOVED_IN, moved_module, present_modules


def moved_class_paths(config: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(key, class path) of every string in ``config`` (a YAML document: nested mappings and lists, keys
    joined by dots) that names a class of a moved module."""
    if isinstance(config, dict):
        for name, value in config.items():
            yield from moved_class_paths(value, f"{key}.{name}" if key else str(name))
    elif isinstance(config, list):
        for index, value in enumerate(config):
            yield from moved_class_paths(value, f"{key}[{index}]")
    elif isinstance(config, str) and moved_module(config.strip()) is not None:
        yield key, config.strip()


def new_class_path(old: str) -> str | None:
    """Where the class ``old`` (in a moved module) is now: its shortest path, the class as a package above its
    module exports it (``mae.data.DigitSceneImagesDataModule``); None when no new module holds it. Imports
    only the modules of the table, never a name from a config."""
    module, _, name = old.rpartition(".")
    for new in present_modules(module):
        found = getattr(importlib.import_module(new), name, None)
        if found is None:
            continue
        parts = new.split(".")
        for depth in range(1, len(parts) + 1):  # the packages above it were imported with it
            package = ".".join(parts[:depth])
            if getattr(sys.modules.get(package), name, None) is found:
                return f"{package}.{name}"
    return None


def moved_class_error(given_as: str, key: str, old: str) -> ConfigError:
    """The error for the class path ``old`` (of a moved module) found at ``key`` of what the user gave as
    ``given_as`` (``--config old.yaml``, ``--data``)."""
    module = moved_module(old)
    release, where = MOVED_IN[module], f"{given_as}: {key + ' ' if key else ''}{old}"
    new = new_class_path(old)
    if new is not None:
        return ConfigError(f"{where} was moved to {new} in {release}: set {new} instead")
    modules = " or ".join(present_modules(module))
    return ConfigError(
        f"{where}: its module {module} was moved to {modules} in {release}, which holds no "
        f"{old.rpartition('.')[2]}; name a class there (CHANGELOG.md lists the moved modules)"
    )


def refuse_moved_class_paths(sources: Iterable[tuple[str, Any]]) -> None:
    """Stop before any work when one of ``sources`` ((how the user gave it, its YAML content or value)) names
    a class of a moved module.

    Raises:
        ConfigError: naming the source, the key, the old class path and the new one (``moved_class_error``).
    """
    for given_as, config in sources:
        for key, old in moved_class_paths(config):
            raise moved_class_error(given_as, key, old)
