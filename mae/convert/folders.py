"""``mae export --to timm|huggingface --out DIR``: the encoder (and decoder) as a folder that timm or
Hugging Face transformers loads, with its ``README.md`` model card (``mae.convert.model_card``). What every
folder target shares is here; each target's own checks and files are its ``FolderFormat``, in its module
of ``mae.convert.exports``.

The folder is written whole into a temporary folder beside ``DIR`` and then put in its place, so an
interrupted export leaves ``DIR`` as it was; a rerun into an export's own folder replaces it whole.
A folder is an export's own when its card carries ``CARD_MARK`` and it holds nothing but the files an
export writes (``is_export_folder``): any other file there is refused, never replaced.
"""

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mae.convert.checkpoint import MAECheckpoint, check_finite
from mae.convert.model_card import CARD_MARK, CardTarget, RunFacts, model_card, read_run
from mae.convert.sources import read_checkpoint
from mae.data.views.normalize import IMAGENET_MEAN, IMAGENET_STD
from mae.io.outputs import Output

# Every file an export folder holds (timm: config.json, model.safetensors; transformers: the same and
# preprocessor_config.json); README.md is the card.
EXPORT_FILES = frozenset({"README.md", "config.json", "model.safetensors", "preprocessor_config.json"})


@dataclass(frozen=True)
class FolderContents:
    """What a folder target writes: the read checkpoint ``ckpt``, its weights ``state`` (the encoder's, or
    the whole model's when ``has_decoder``), the run's ``facts`` (``mae.convert.model_card.read_run``) and
    the input normalisation, one ``mean`` / ``std`` value per channel (the checkpoint's record, else
    ImageNet's)."""

    ckpt: MAECheckpoint
    state: dict[str, torch.Tensor]
    facts: RunFacts
    has_decoder: bool
    mean: list[float]
    std: list[float]


@dataclass(frozen=True)
class FolderFormat:
    """One folder target's own part (``mae.convert.exports.timm``, ``.huggingface``).

    Attributes:
        name: the target's name (``--to``).
        check: ``check(ckpt, encoder_only)`` refuses, before anything is written, what the folder cannot
            represent (raises ``ConfigError`` naming the value); returns whether the folder holds the
            decoder.
        write: ``write(contents, folder)`` writes the target's files (every one in ``EXPORT_FILES``) into
            ``folder``, the card aside.
        card: its model card's library and usage (``mae.convert.model_card.CardTarget``).
    """

    name: str
    check: Callable[[MAECheckpoint, bool], bool]
    write: Callable[[FolderContents, Path], None]
    card: CardTarget


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


def export_folder(
    source: str | Path,
    out: str | Path,
    target: FolderFormat,
    format: str = "auto",
    encoder_only: bool = False,
    num_heads: int | None = None,
) -> FolderExport:
    """Write the export of ``source`` to ``target`` (``mae.convert.exports.timm.FOLDER``, ``...huggingface
    .FOLDER``) as the folder ``out``, with its model card. ``encoder_only``: a Hugging Face
    ``ViTMAEModel`` even when the checkpoint has a decoder (timm folders always hold the encoder alone);
    ``num_heads``: for files that do not say.

    Raises:
        ConfigError: what ``target`` cannot represent (``FolderFormat.check``), before anything is written.
        InputError: NaN / infinite weights, naming the file.
    """
    ckpt = read_checkpoint(source, format)
    if num_heads is not None:
        ckpt.config["num_heads"] = num_heads
    decoder = target.check(ckpt, encoder_only)
    state = ckpt.state_dict if decoder else ckpt.encoder_state_dict()
    check_finite(state, ckpt.source)
    data = ckpt.data or {}
    mean, std = data.get("mean", list(IMAGENET_MEAN)), data.get("std", list(IMAGENET_STD))
    contents = FolderContents(ckpt, state, read_run(ckpt), decoder, mean, std)
    out = Path(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        target.write(contents, tmp)
        card = model_card(contents.facts, target.card, out.name, decoder)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        _put_in_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return FolderExport(out, target.name, decoder, list(ckpt.notes))


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
