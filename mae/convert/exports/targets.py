"""The one table of export targets (``EXPORT_TARGETS``) and the one way to choose a target: ``--to NAME``,
or an ``--out`` whose suffix is a file target's (``--out x.onnx`` is shorthand for ``--to onnx``,
``--out x.safetensors`` for ``--to safetensors``). A new target is a module in ``mae.convert.exports`` and
one row here."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mae.convert.exports import huggingface, onnx, safetensors, timm
from mae.convert.exports.base import ExportTarget
from mae.errors import UsageError

EXPORT_TARGETS: dict[str, ExportTarget] = {
    target.name: target for target in (safetensors.TARGET, onnx.TARGET, timm.TARGET, huggingface.TARGET)
}
# Every target's own options with their defaults (``ExportTarget.options``).
TARGET_OPTIONS: dict[str, Any] = {k: v for t in EXPORT_TARGETS.values() for k, v in t.options.items()}


def choose_target(to: str | None, out: str | Path) -> ExportTarget:
    """The target ``to`` names, else the file target whose suffix ``out`` has.

    Raises:
        UsageError: an unknown ``to``; no ``to`` and an ``out`` of no file target's suffix; a file target
            for an ``out`` of another suffix, or a folder target for an ``out`` of a file target's suffix.
    """
    by_suffix = {t.suffix: t for t in EXPORT_TARGETS.values() if t.suffix}
    suffix = Path(out).suffix
    if to is None:
        if suffix not in by_suffix:
            raise UsageError(
                f"--out must end in .safetensors (a timm ViT) or .onnx (an ONNX file), got {out}; or write a "
                f"folder with --to {' or '.join(t.name for t in EXPORT_TARGETS.values() if not t.suffix)}"
            )
        return by_suffix[suffix]
    if to not in EXPORT_TARGETS:
        raise UsageError(f"--to must be one of {', '.join(EXPORT_TARGETS)}, got {to!r}")
    target = EXPORT_TARGETS[to]
    if target.suffix is None and suffix in by_suffix:
        raise UsageError(f"--to {to} writes a folder: give --out a folder path, not {out}")
    if target.suffix is not None and suffix != target.suffix:
        raise UsageError(
            f"--to {to} writes a {target.suffix} file: give --out a path ending in it, not {out}"
        )
    return target


def check_options(target: ExportTarget, options: Mapping[str, Any]) -> None:
    """Refuse the options of other targets given with ``target`` (``options``: every target's, by name).

    Raises:
        UsageError: naming the options, the target they are for and the one chosen.
    """
    for other in EXPORT_TARGETS.values():
        given = [
            name
            for name, default in other.options.items()
            if other is not target and options.get(name, default) != default
        ]
        if given:
            flags = ", ".join(f"--{name.replace('_', '-')}" for name in given)
            raise UsageError(f"{flags}: for {other.applies}; leave out for {target.label}")
