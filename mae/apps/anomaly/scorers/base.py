"""The interface every anomaly scorer of ``mae anomaly`` has (``Scorer``), and what they share: how files are
read (``Reading``), what the command was told about the model and preprocessing (``ModelInputs``), the normal
images a scorer is fitted on (``NormalImages``) and its settings (``ScorerSettings``, whose fields made with
``option`` are the scorer's own command-line flags).

A scorer turns (N, C, H, W) images into (N, L) per-patch errors (``patch_errors``); the rest is shared:
the errors standardised by the normal images' ``statistics`` (when it has them), image scores, heat maps
smoothed by ``sigma`` pixels, metrics (``score``), and the folder ``--save-scorer`` writes (``save``). It is
made one of two ways, never both: fitted on normal images (``fit``), or read back from a saved scorer
(``load``), with its own settings, preprocessing and model.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import torch

from mae.apps.anomaly.evaluation import AnomalyResult, file_errors, score_test_set
from mae.apps.anomaly.layout import TestSet
from mae.apps.anomaly.saved_scorer import SavedScorer, preprocessing, save_scorer
from mae.apps.anomaly.scoring import NormalStatistics
from mae.apps.anomaly.threshold import Decision
from mae.apps.embeddings.embedder import Embedder, load_embedder
from mae.convert.sources import MAECheckpoint
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import UsageError
from mae.inference.normalization import Normalization


@dataclass(frozen=True)
class Reading:
    """How image files and checkpoints are read: ``batch_size`` images at a time, images over
    ``max_pixels`` pixels refused, the model on ``device``, checkpoints in ``checkpoint_format``
    (``batch_size`` >= 1: ``mae anomaly``'s parser checks it, ``--batch-size``)."""

    device: str = "cpu"
    batch_size: int = 32
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    checkpoint_format: str = "auto"

    def embedder(
        self,
        checkpoint: Path | MAECheckpoint,
        img_size: int | tuple[int, int] | None,
        norm: Normalization | None,
        fingerprint: str | None = None,
    ) -> Embedder:
        """The encoder of ``checkpoint`` (a path or a read checkpoint) at ``img_size`` with ``norm`` (None:
        the checkpoint's), on this device (``load_embedder``)."""
        return load_embedder(
            checkpoint,
            format=self.checkpoint_format,
            img_size=img_size,
            norm=norm,
            device=self.device,
            max_pixels=self.max_pixels,
            fingerprint=fingerprint,
        )


@dataclass(frozen=True)
class ModelInputs:
    """What the command was given about the model and the images' preprocessing: ``checkpoint`` (None: a
    saved scorer's own, or no model), ``img_size`` pixels (None: the checkpoint's or the scorer's),
    ``mean`` / ``std`` per channel (None: the checkpoint's record, ImageNet's, or the scorer's). The parser
    of ``mae anomaly`` checks them (``mae.cli.command_options``): a positive size, ``--mean`` and ``--std``
    together with one value each per channel."""

    checkpoint: Path | None = None
    img_size: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    def normalization(self, in_chans: int) -> Normalization | None:
        """--mean / --std as a ``Normalization`` of ``in_chans`` channels; None when not given."""
        return Normalization(in_chans, tuple(self.mean), tuple(self.std)) if self.mean else None


@dataclass(frozen=True)
class NormalImages:
    """The defect-free ``images`` a scorer is fitted on, of the folder ``folder`` (--normal; None: none)."""

    folder: Path | None
    images: list[Path]


@dataclass(frozen=True)
class Option:
    """A command-line flag, declared where the setting it sets lives (the command adds it to its parser):
    ``--<name with - for _>`` sets ``name``; ``kind``: the type of its value (int, float, str, Path) or bool
    (a switch); ``many``: one value or more; ``choices``: the values allowed (None: any)."""

    name: str
    kind: type
    help: str
    many: bool = False
    default: Any = None
    choices: tuple[str, ...] | None = None
    required: bool = False

    @property
    def flag(self) -> str:
        return flag(self.name)


def option(default: Any, kind: type, help: str, many: bool = False) -> Any:
    """A settings field that is also a flag of the scorer's own (``Scorer.options``)."""
    return field(default=default, metadata={"option": (kind, help, many)})


def flag(name: str) -> str:
    """The command-line spelling of a settings field: ``top_k`` -> ``--top-k``."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True, kw_only=True)
class ScorerSettings:
    """What every scorer's settings hold (their flags are the command's): ``seed`` draws everything random
    (and which normal images are held out), the image score is the mean of the ``top_k`` highest patch
    scores.

    Raises:
        UsageError: ``top_k`` below 1.
    """

    seed: int = 0
    top_k: int = 4

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise UsageError(f"--top-k must be at least 1, got {self.top_k}")

    @classmethod
    def of(cls, values: dict) -> "ScorerSettings":
        """The settings of ``values`` (flags, or a saved record's settings): the fields there and not None;
        the others their defaults."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if values.get(f.name) is not None})


@dataclass(kw_only=True)
class Scorer(ABC):
    """A fitted anomaly scorer.

    Attributes:
        settings: its ``Settings``.
        size: (H, W) pixels the images are read at, with ``norm``.
        grid_size: (H/p, W/p) patches its errors are given for, row-major.
        saved: its tensors and record, what ``save`` writes (the decision is added then).
        recorded: what ``metrics.json``'s settings record of it.
        messages: what the command prints about its fit, or about the scorer it was read from.
        applied: the folder it was read from (``load``); None when this run fitted it.
        statistics: the normal images' per-position statistics its errors are standardised by; None: raw.
    """

    name: ClassVar[str]  # --method's value and the saved record's "method"
    summary: ClassVar[str]  # what it scores by, for --method's help
    Settings: ClassVar[type[ScorerSettings]] = ScorerSettings
    sigma: ClassVar[float] = 0.0  # the maps' Gaussian smoothing, pixels (0: none)
    # what a fit needs given ("checkpoint", "normal", "img_size"), and why: the words after "--method
    # <name> needs --<flag>" in the error without it
    needs: ClassVar[dict[str, str]] = {}

    settings: ScorerSettings
    size: tuple[int, int]
    grid_size: tuple[int, int]
    norm: Normalization
    saved: SavedScorer
    recorded: dict
    messages: list[str] = field(default_factory=list)
    applied: Path | None = None
    statistics: NormalStatistics | None = None

    @classmethod
    def options(cls) -> list[Option]:
        """Its own flags: its settings' fields made with ``option``."""
        return [Option(f.name, *f.metadata["option"]) for f in fields(cls.Settings) if "option" in f.metadata]

    @classmethod
    def check_fit(cls, settings: ScorerSettings, inputs: ModelInputs, normal: Path | None) -> None:
        """Refuse, before anything is read, a fit that lacks what it needs (``needs``) or gives what it
        cannot use.

        Raises:
            UsageError: naming the flag and the fix.
        """
        given = {"checkpoint": inputs.checkpoint, "normal": normal, "img_size": inputs.img_size}
        for name, why in cls.needs.items():
            if given[name] is None:
                raise UsageError(f"--method {cls.name} needs {flag(name)}{why}")

    @classmethod
    def check_apply(cls, inputs: ModelInputs) -> None:
        """Refuse, before anything is read, what a saved scorer of this kind cannot be applied with.

        Raises:
            UsageError: naming the flag and the fix.
        """
        return None

    @classmethod
    @abstractmethod
    def fit(
        cls, settings: ScorerSettings, inputs: ModelInputs, normal: NormalImages, reading: Reading
    ) -> "Scorer":
        """The scorer fitted on the ``normal`` images with ``settings``."""

    @classmethod
    @abstractmethod
    def load(cls, saved: SavedScorer, folder: Path, inputs: ModelInputs, reading: Reading) -> "Scorer":
        """The scorer ``saved`` (read from ``folder``), with its own settings, preprocessing and model.

        Raises:
            UsageError: ``inputs`` that are not the scorer's (another size or normalisation).
            ConfigError: a model with other weights than the scorer's.
        """

    @abstractmethod
    def patch_errors(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) images read at ``size`` with ``norm`` -> (N, L) per-patch errors, higher = more
        anomalous, row-major over ``grid_size``."""

    def score(self, images: TestSet, reading: Reading) -> AnomalyResult:
        """Scores, maps and (labelled ``images``) metrics of ``images``: test, held-out normal and
        validation images alike."""
        paths = [i.path for i in images.images]
        errors = file_errors(
            self.patch_errors, paths, self.size, self.norm, reading.batch_size, reading.max_pixels
        )
        top_k = self.settings.top_k
        return score_test_set(errors, images, self.grid_size, self.size, top_k, self.statistics, self.sigma)

    def own_decision(self) -> Decision | None:
        """The decision a saved scorer was saved with (None: none, or fitted by this run); one of format 1
        read under today's rule (``Decision.from_json``)."""
        record = self.saved.record.get("decision")
        former_rule = self.saved.record.get("version") == 1
        return Decision.from_json(record, flagged_at_threshold=former_rule) if record else None

    def save(self, folder: Path, decision: Decision | None) -> Path:
        """Write the scorer to ``folder`` (``save_scorer``) with ``decision``."""
        record = {**self.saved.record, "decision": decision.to_json() if decision is not None else None}
        return save_scorer(folder, self.saved.tensors, record)

    @classmethod
    def fitted_record(
        cls,
        settings: dict,
        normal: NormalImages,
        size: tuple[int, int],
        norm: Normalization,
        encoder: dict | None,
    ) -> dict:
        """The record a fitted scorer is saved with (``save_scorer``): its ``settings``, the ``normal``
        images it was fitted on, its (size, normalisation) and its model's ``encoder`` identity (checkpoint
        and fingerprint; None without a model); the decision is set by ``Scorer.save``."""
        return {
            "method": cls.name,
            "settings": settings,
            "normal": None if normal.folder is None else str(normal.folder),
            "normal_images": len(normal.images),
            "preprocessing": preprocessing(size, norm),
            "encoder": encoder,
            "decision": None,
        }

    @staticmethod
    def applied_settings(saved: SavedScorer, folder: Path) -> dict:
        """What metrics.json's settings add for an applied scorer: its folder and the normal images it was
        fitted on."""
        return {"scorer": str(folder), "normal": saved.record["normal"]}
