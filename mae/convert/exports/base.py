"""The interface of an export target: ``ExportTarget``, one row of ``mae.convert.exports.targets``, and
``ExportRequest``, what every target is asked."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mae.io.outputs import Output


@dataclass(frozen=True)
class ExportRequest:
    """One export: the ``checkpoint`` (read with ``checkpoint_format``), where to write (``out``), the heads
    for files that do not say (``num_heads``) and the target's own ``options`` by name (``ExportTarget``)."""

    checkpoint: str
    out: Path
    checkpoint_format: str = "auto"
    num_heads: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportTarget:
    """One thing ``mae export`` writes.

    Attributes:
        name: ``--to``'s value.
        suffix: the ``--out`` suffix that is shorthand for ``--to NAME`` (a file target); None for a
            target that writes a folder (``--to`` names it).
        options: the options only this target takes, with their defaults (``--pool``: ``{"pool": None}``);
            given with another target they are refused.
        applies: when its options apply, in words ("ONNX output only (an --out ending in .onnx)").
        outputs: the paths it writes for an ``--out``, for ``mae.io.outputs.check_outputs``.
        export: writes the request's export; returns what it wrote.
        describe: lines for the user about what ``export`` returned: what was written, how to load it.
        check: its own checks of a request, before anything is read (raises ``mae.errors`` types); none
            by default.
    """

    name: str
    suffix: str | None
    options: Mapping[str, Any]
    applies: str
    outputs: Callable[[Path], list[Output]]
    export: Callable[[ExportRequest], Any]
    describe: Callable[[Any], list[str]]
    check: Callable[[ExportRequest], None] = lambda request: None

    @property
    def label(self) -> str:
        """How the user chose it: ``.onnx`` for a file target, ``--to timm`` for a folder target."""
        return self.suffix or f"--to {self.name}"
