"""``mae export --to timm|huggingface --out DIR``: the encoder (and decoder) as a folder that timm or
Hugging Face transformers loads, with its ``README.md`` model card (``mae.convert.model_card``).

The folder is written whole into a temporary folder beside ``DIR`` and then put in its place, so an
interrupted export leaves ``DIR`` as it was; a rerun into an export's own folder replaces it whole.
A folder is an export's own when its card carries ``CARD_MARK`` and it holds nothing but the files an
export writes (``is_export_folder``): any other file there is refused, never replaced.
"""

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from mae.convert.checkpoint import MAECheckpoint, check_finite
from mae.convert.formats import huggingface, timm_folder
from mae.convert.huggingface import hf_config_of
from mae.convert.model_card import CARD_MARK, card_license, model_card, read_run
from mae.convert.sources import read_checkpoint
from mae.data.views.normalize import IMAGENET_MEAN, IMAGENET_STD
from mae.errors import ConfigError
from mae.io.outputs import Output

TARGETS = ("timm", "huggingface")
# Every file an export folder holds (timm: config.json, model.safetensors; transformers: the same and
# preprocessor_config.json); README.md is the card.
EXPORT_FILES = frozenset({"README.md", "config.json", "model.safetensors", "preprocessor_config.json"})
DEFAULT_CROP_PCT = 224 / 256  # our data modules' evaluation crop ratio unless the run set another


@dataclass
class FolderExport:
    """What ``export_folder`` wrote: the ``folder``, its ``target``, whether it holds the decoder, and
    the checkpoint's load ``notes``."""

    folder: Path
    target: str
    has_decoder: bool
    notes: list[str]


def is_export_folder(folder: Path) -> bool:
    """Whether ``folder`` is one ``export_folder`` wrote: its card carries ``CARD_MARK`` and every entry
    is a file an export writes."""
    try:
        names = {p.name for p in Path(folder).iterdir()}
        card = (Path(folder) / "README.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    files = all((Path(folder) / name).is_file() for name in names)
    return CARD_MARK in card and names <= EXPORT_FILES and files


def check_target(ckpt: MAECheckpoint, target: str, encoder_only: bool) -> bool:
    """Refuse, before anything is written, what ``target`` cannot represent; returns whether the folder
    will hold the decoder.

    Raises:
        ConfigError: naming the value: an unknown target, a LayerNorm eps timm does not use, a decoder or
            input size transformers' ViTMAEForPreTraining does not have, transformers not installed.
    """
    if target not in TARGETS:
        raise ConfigError(f"--to must be one of {', '.join(TARGETS)}, got {target!r}")
    if target == "timm":
        timm_folder.check(ckpt)
        return False
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError(
            "a Hugging Face folder needs transformers for its image processor: "
            'pip install "transformers>=5.25"'
        ) from None
    decoder = ckpt.has_decoder and not encoder_only
    hf_config_of(ckpt.config, decoder)
    return decoder


def export_folder(
    source: str | Path,
    out: str | Path,
    target: str,
    format: str = "auto",
    encoder_only: bool = False,
    num_heads: int | None = None,
) -> FolderExport:
    """Write the export of ``source`` to ``target`` ("timm" or "huggingface") as the folder ``out``, with
    its model card. ``encoder_only``: a Hugging Face ``ViTMAEModel`` even when the checkpoint has a
    decoder (timm folders always hold the encoder alone); ``num_heads``: for files that do not say."""
    ckpt = read_checkpoint(source, format)
    if num_heads is not None:
        ckpt.config["num_heads"] = num_heads
    decoder = check_target(ckpt, target, encoder_only)
    state = ckpt.state_dict if decoder else ckpt.encoder_state_dict()
    check_finite(state, ckpt.source)
    facts = read_run(ckpt)
    data = ckpt.data or {}
    mean, std = data.get("mean", list(IMAGENET_MEAN)), data.get("std", list(IMAGENET_STD))
    out = Path(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if target == "timm":
            size = ckpt.config["img_size"]
            size = [size, size] if isinstance(size, int) else list(size)
            data_config = {
                "input_size": (ckpt.config["in_chans"], *size),
                "mean": tuple(mean),
                "std": tuple(std),
                "interpolation": "bicubic",
                "crop_pct": _crop_pct(facts.run_config),
                "crop_mode": "center",
            }
            timm_folder.write(ckpt, tmp, data_config, card_license(facts))
        else:
            mask_ratio = facts.hparams.get("mask_ratio", 0.75)
            huggingface.write(state, ckpt.config, tmp, decoder, mask_ratio, mean, std)
        card = model_card(facts, target, out.name, decoder)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        _put_in_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return FolderExport(out, target, decoder, list(ckpt.notes))


def folder_outputs(out: Path) -> list[Output]:
    """The folder an export writes, for ``check_outputs``: its own (``is_export_folder``) or refused."""
    return [Output(out, "--out", "folder", is_export_folder)]


def folder_lines(export: FolderExport, load: str) -> list[str]:
    """Lines for the user: the checkpoint's notes, what the folder holds, ``load`` (how to load it), how
    to upload it."""
    files = ", ".join(sorted(p.name for p in export.folder.iterdir()))
    what = "encoder and decoder" if export.has_decoder else "encoder"
    return [
        *(f"note: {note}" for note in export.notes),
        f"wrote the {what} to {export.folder}/ ({files})",
        load,
        f"upload: hf upload USER/REPO {export.folder} .",
    ]


def _crop_pct(run_config: dict | None) -> float:
    """The run's evaluation crop ratio (``data.init_args.eval_crop_ratio``), else our default."""
    init_args = ((run_config or {}).get("data") or {}).get("init_args") or {}
    return init_args.get("eval_crop_ratio") or DEFAULT_CROP_PCT


def _put_in_place(tmp: Path, out: Path) -> None:
    """``tmp`` renamed to ``out``; an earlier export there (checked by the caller) moved aside first and
    removed after."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists() and any(out.iterdir()):
        os.rename(out, old)
    elif out.exists():
        out.rmdir()
    try:
        os.rename(tmp, out)
    except OSError:
        if old.exists():
            os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
