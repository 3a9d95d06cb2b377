"""A fitted anomaly scorer kept on disk, to score new images later without the normal images: a folder of
``scorer.safetensors`` (its tensors: a feature bank, normal error statistics or normal images) and
``scorer.json`` (what it is: method, settings, preprocessing, the model's path and weights fingerprint, the
decision threshold). No pickle. ``scorer.json`` is written last and records the SHA-256 of the tensors
file, so a folder whose writing was cut off, or whose tensors were replaced, is refused rather than read;
the tensors file's metadata holds the SHA-256 of the record it was saved with, so a record edited by hand
(another image size, another threshold) or taken from another scorer is refused too.
A scorer is applied only with its own preprocessing (``check_saved_preprocessing``) and model weights
(``saved_checkpoint``).
"""

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from mae.apps.embeddings.embedder import weights_fingerprint
from mae.convert.sources import MAECheckpoint, read_checkpoint
from mae.errors import ConfigError, InputError, MissingFileError, UsageError
from mae.inference.normalization import Normalization
from mae.io.atomic import atomic_write
from mae.io.outputs import Output, check_outputs, claim_folder

COMMAND = "mae.anomaly"
FORMAT = "mae-anomaly-scorer"
VERSION = 2  # 2: decisions flag a score above the threshold; 1 (mae 0.3, 0.4): at least it (``threshold``)
READABLE_VERSIONS = (1, 2)
TENSORS, RECORD = "scorer.safetensors", "scorer.json"
RECORD_HASH = "mae_scorer_record_sha256"  # the tensors file's metadata key: the record it belongs to


class SavedScorer(NamedTuple):
    """A scorer's ``tensors`` (name -> tensor) and its JSON ``record``."""

    tensors: dict[str, torch.Tensor]
    record: dict


def scorer_output(folder: Path, option: str = "--save-scorer") -> Output:
    """The folder ``save_scorer`` writes, for ``check_outputs`` at start-up: ours when an earlier run of the
    command wrote it, refused when it holds anything else."""
    return Output(Path(folder), option, kind="folder")


def save_scorer(folder: str | Path, tensors: dict[str, torch.Tensor], record: dict) -> Path:
    """Write ``tensors`` to ``folder/scorer.safetensors`` and ``record`` (JSON-able; ``format``,
    ``version`` and the tensors file's ``sha256`` added) to ``folder/scorer.json``, each atomically, the
    record last. The folder is claimed for ``mae anomaly`` (``mae.io.outputs``).

    Raises:
        OutputError: ``folder`` holds files no run of ``mae anomaly`` wrote (nothing is written).
    """
    folder = Path(folder)
    check_outputs(COMMAND, [scorer_output(folder)])
    claim_folder(folder, COMMAND)
    contiguous = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    own = {key: value for key, value in record.items() if key not in ("format", "version", "sha256")}
    described = json.loads(json.dumps({"format": FORMAT, "version": VERSION, **own}))  # as read back
    metadata = {"format": "pt", RECORD_HASH: _record_sha256(described)}
    atomic_write(folder / TENSORS, lambda tmp: save_file(contiguous, str(tmp), metadata=metadata))
    full = {**described, "sha256": _sha256(folder / TENSORS)}
    atomic_write(folder / RECORD, lambda tmp: tmp.write_text(json.dumps(full, indent=2) + "\n"))
    return folder


def load_scorer(folder: str | Path) -> SavedScorer:
    """The tensors and record ``save_scorer`` wrote to ``folder``.

    Raises:
        MissingFileError: no such folder, or no ``scorer.json`` / ``scorer.safetensors`` in it.
        InputError: a record that is not a scorer's (another program's JSON, a newer version), or tensors
            that are not the ones it records (corrupt, cut off or replaced), naming the file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise MissingFileError(
            f"--scorer {folder} is not a folder: give the folder a run with --save-scorer wrote"
        )
    for name in (RECORD, TENSORS):
        if not (folder / name).is_file():
            raise MissingFileError(
                f"--scorer {folder} holds no {name}: give the folder a run with --save-scorer wrote "
                f"(it holds {RECORD} and {TENSORS})"
            )
    try:
        record = json.loads((folder / RECORD).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputError(f"{folder / RECORD} is not a scorer record ({err}): save the scorer again") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise InputError(
            f'{folder / RECORD} is not a scorer record of mae anomaly (no "format": "{FORMAT}"): give '
            "the folder a run with --save-scorer wrote"
        )
    if record.get("version") not in READABLE_VERSIONS:
        raise InputError(
            f"{folder / RECORD} is a scorer of version {record.get('version')}; this mae reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}: save the scorer again with this version"
        )
    if _sha256(folder / TENSORS) != record.get("sha256"):
        raise InputError(
            f"{folder / TENSORS} is not the file {RECORD} records (its SHA-256 differs: corrupt, cut off or "
            "replaced): save the scorer again"
        )
    try:
        tensors = load_file(folder / TENSORS)
        with safe_open(folder / TENSORS, framework="pt") as f:
            saved_with = (f.metadata() or {}).get(RECORD_HASH)
    except (SafetensorError, OSError) as err:
        raise InputError(f"cannot read {folder / TENSORS} ({err}): save the scorer again") from None
    described = {key: value for key, value in record.items() if key != "sha256"}
    if saved_with != _record_sha256(described):
        raise InputError(
            f"{folder / RECORD} is not the record {TENSORS} was saved with (edited, or taken from another "
            "scorer): a scorer is applied only as it was fitted; save the scorer again"
        )
    return SavedScorer(tensors, record)


def preprocessing(size: tuple[int, int], norm: Normalization) -> dict:
    """A scorer record's ``preprocessing``: the input ``size`` (H, W) pixels and its normalisation."""
    return {"img_size": list(size), "in_chans": norm.in_chans, "mean": list(norm.mean), "std": list(norm.std)}


def check_saved_preprocessing(
    saved: SavedScorer, scorer: Path, img_size: int | None, mean: Sequence[float] | None, std
) -> tuple[tuple[int, int], Normalization]:
    """The (H, W) size and the normalisation ``saved`` was fitted with.

    Raises:
        UsageError: an ``img_size`` (--img-size) or ``mean`` / ``std`` given and other than the scorer's,
            naming both.
    """
    pre = saved.record["preprocessing"]
    size = tuple(pre["img_size"])
    if img_size is not None and (img_size, img_size) != size:
        raise UsageError(
            f"--img-size {img_size} is not the size of --scorer {scorer}, {'x'.join(map(str, size))}: leave "
            "--img-size out, or fit a scorer at that size"
        )
    if mean is not None and (list(mean), list(std)) != (pre["mean"], pre["std"]):
        raise UsageError(
            f"--mean {list(mean)} --std {list(std)} are not the normalisation of --scorer {scorer} (--mean "
            f"{pre['mean']} --std {pre['std']}): leave them out"
        )
    return size, Normalization(pre["in_chans"], tuple(pre["mean"]), tuple(pre["std"]))


def saved_checkpoint(
    saved: SavedScorer, scorer: Path, checkpoint: Path | None, checkpoint_format: str, decoder: bool
) -> tuple[MAECheckpoint, str]:
    """The checkpoint of ``saved``'s model (``checkpoint`` in ``checkpoint_format``, or the one it
    records) and its ``weights_fingerprint`` (``decoder``: of the whole MAE), checked to be the scorer's.

    Raises:
        ConfigError: a checkpoint with other weights than the scorer's, naming both checkpoints and
            fingerprints.
        MissingFileError: no ``checkpoint`` and the recorded one is gone.
    """
    recorded = saved.record["encoder"]
    path = checkpoint or Path(recorded["checkpoint"])
    if checkpoint is None and not path.exists():
        raise MissingFileError(
            f"the encoder of --scorer {scorer}, {path}, does not exist: pass --checkpoint with the same "
            "weights"
        )
    ckpt = read_checkpoint(path, checkpoint_format)
    fingerprint = weights_fingerprint(ckpt, decoder=decoder)
    if fingerprint != recorded["fingerprint"]:
        raise ConfigError(
            f"--checkpoint {path} (weights {fingerprint[:12]}) is not the encoder of --scorer {scorer}: "
            f"{recorded['checkpoint']} (weights {recorded['fingerprint'][:12]}); give that encoder, or fit a "
            "scorer with this one"
        )
    return ckpt, fingerprint


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _record_sha256(record: dict) -> str:
    """SHA-256 of ``record`` as canonical JSON (sorted keys): what the tensors file's metadata binds."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
