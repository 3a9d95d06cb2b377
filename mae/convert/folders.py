"""``mae export --to timm|huggingface --out DIR``: the encoder (and decoder) as a folder that timm or
Hugging Face transformers loads, with its ``README.md`` model card (``mae.convert.model_card``). What every
folder target shares is here; each target's own checks and files are its ``FolderFormat``, in its module
of ``mae.convert.exports``.

The folder is written whole into a temporary folder beside ``DIR`` and then put in its place, so an
interrupted export leaves ``DIR`` as it was; a rerun into an export's own folder replaces it whole.
A folder is an export's own when its card carries ``CARD_MARK`` and it holds nothing but the files an
export writes (``is_export_folder``): any other file there is refused, never replaced.

``DIR`` a link to a folder is written through: the folder it leads to is replaced (built beside that
folder, then swapped in) and the link stays as it is. The current folder is refused (``check_place``):
swapping it would leave the shell that runs the command in a removed folder.

A fine-tuned checkpoint (``mae finetune``) is exported with its classifier where the target holds one
(``mae.convert.classifier``; each target's ``check`` refuses what it cannot compute).
"""

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mae.convert.checkpoint import MAECheckpoint, check_finite
from mae.convert.classifier import Classifier, classifier_of, linear_head
from mae.convert.exports.base import ExportRequest
from mae.convert.families import check_num_heads
from mae.convert.model_card import CARD_MARK, CardTarget, RunFacts, model_card, read_run
from mae.convert.sources import read_checkpoint
from mae.data.views.normalize import IMAGENET_MEAN, IMAGENET_STD
from mae.errors import ConfigError
from mae.io.atomic import replace_folder
from mae.io.outputs import Output, OutputError

# Every file an export folder holds (timm: config.json, model.safetensors; transformers: the same and
# preprocessor_config.json); README.md is the card.
EXPORT_FILES = frozenset({"README.md", "config.json", "model.safetensors", "preprocessor_config.json"})


@dataclass(frozen=True)
class FolderContents:
    """What a folder target writes: the read checkpoint ``ckpt``, its weights ``state`` (the encoder's, or
    the whole model's when ``has_decoder``; with ``classifier``, the encoder's and its head as one linear
    layer: ``mae.convert.classifier.linear_head``), the run's ``facts``
    (``mae.convert.model_card.read_run``) and the input normalisation, one ``mean`` / ``std`` value per
    channel (the checkpoint's record, else ImageNet's)."""

    ckpt: MAECheckpoint
    state: dict[str, torch.Tensor]
    facts: RunFacts
    has_decoder: bool
    mean: list[float]
    std: list[float]
    classifier: Classifier | None = None


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
    """What ``export_folder`` wrote: the ``folder`` (as the user named it: a link stays a link), its
    ``target``, whether it holds the decoder, the checkpoint's load ``notes`` and its ``classifier`` (None:
    the encoder's features only)."""

    folder: Path
    target: str
    has_decoder: bool
    notes: list[str]
    classifier: Classifier | None = None


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
    ``ViTMAEModel`` even when the checkpoint has a decoder or a classifier's head (timm folders hold the
    encoder, with its head when the checkpoint is a fine-tuned classifier); ``num_heads``: for files that do
    not say. A link ``out`` is written through (the module's doc).

    Raises:
        OutputError: an ``out`` it cannot replace whole (``check_place``), before anything is read.
        ConfigError: what ``target`` cannot represent (``FolderFormat.check``), before anything is written.
        InputError: NaN / infinite weights, naming the file.
    """
    check_place(out, source)
    ckpt = read_checkpoint(source, format)
    refused = ckpt.model_family.refuses.get(target.name)
    if refused:
        raise ConfigError(
            f"{ckpt.source} holds the {ckpt.model_family.described} {ckpt.config.get('encoder')}: {refused}"
        )
    check_num_heads(ckpt, num_heads)
    if num_heads is not None:
        ckpt.config["num_heads"] = num_heads
    decoder = target.check(ckpt, encoder_only)
    classifier = None if encoder_only else classifier_of(ckpt)
    if decoder:
        state = ckpt.state_dict
    elif classifier is not None:
        state = linear_head(ckpt.encoder_state_dict())
    else:  # the features: a classifier's head left out
        state = {k: v for k, v in ckpt.encoder_state_dict().items() if not k.startswith("head.")}
    check_finite(state, ckpt.source)
    data = ckpt.data or {}
    mean, std = data.get("mean", list(IMAGENET_MEAN)), data.get("std", list(IMAGENET_STD))
    contents = FolderContents(ckpt, state, read_run(ckpt), decoder, mean, std, classifier)
    out = Path(out)
    place = Path(os.path.realpath(out))  # through a link, the folder it leads to
    tmp = place.parent / f".{place.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        target.write(contents, tmp)
        card = model_card(contents.facts, target.card, out.name, decoder, classifier)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        replace_folder(tmp, place)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    notes = list(ckpt.notes)
    if classifier is not None and classifier.probe:
        notes.append("the linear probe's BatchNorm is folded into its linear head (the same logits)")
    return FolderExport(out, target.name, decoder, notes, classifier)


def check_place(out: str | Path, checkpoint: str | Path) -> None:
    """Refuse, before anything is read, an ``out`` folder an export cannot replace whole (the other cases,
    a foreign file there included, are the output rule's: ``folder_outputs``).

    Raises:
        OutputError: naming ``out``: a link to nothing; the current folder (swapping it would leave the
            shell in a removed folder); a folder that holds the input checkpoint; a link whose folder
            lies in a folder this user cannot write (the new folder is built there).
    """
    out = Path(out)
    place = Path(os.path.realpath(out))
    if out.is_symlink() and not out.exists():
        raise OutputError(
            f"--out {out} is a link to {os.readlink(out)}, which does not exist: create that folder, or give "
            "--out a new path"
        )
    if place == Path(os.path.realpath(os.getcwd())):
        raise OutputError(
            f"--out {out} is the current folder ({place}): an export is built beside its folder and swapped "
            f"in whole, which would leave this shell in the removed folder; run it from {place.parent} with "
            f"--out {place.name}"
        )
    source = Path(os.path.realpath(checkpoint))
    if source != place and source.is_relative_to(place):  # the same path: the output rule refuses it
        raise OutputError(
            f"--out {out} holds the input --checkpoint {checkpoint}, which replacing the folder would "
            "remove: write the export to another folder"
        )
    if out.is_symlink() and not os.access(place.parent, os.W_OK | os.X_OK):
        raise OutputError(
            f"--out {out} links to {place}, so the export is built beside it in {place.parent}, which this "
            "user cannot write: choose a folder you can write"
        )


def check_request(request: ExportRequest) -> None:
    """A folder target's own check of a request (``ExportTarget.check``, before the output rule's):
    ``check_place``."""
    check_place(request.out, request.checkpoint)


def folder_outputs(out: Path) -> list[Output]:
    """The folder an export writes, for ``check_outputs``: its own (``is_export_folder``) or refused."""
    return [Output(out, "--out", "folder", is_export_folder)]


def folder_lines(export: FolderExport, load: str) -> list[str]:
    """Lines for the user: the checkpoint's notes, what the folder holds, ``load`` (how to load it), how
    to upload it."""
    files = ", ".join(sorted(p.name for p in export.folder.iterdir()))
    what = "encoder and decoder" if export.has_decoder else "encoder"
    if export.classifier is not None:
        what = f"encoder with its head, {export.classifier.described},"
    return [
        *(f"note: {note}" for note in export.notes),
        f"wrote the {what} to {export.folder}/ ({files})",
        load,
        f"upload: hf upload USER/REPO {export.folder} .",
    ]
