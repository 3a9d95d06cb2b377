"""``--method mae``: an MAE's reconstruction error. Every patch is hidden by complementary masks
(``mae.apps.anomaly.masks``) and rebuilt from its context; its error (``mae.apps.anomaly.scoring``) is
standardised per patch position by the errors of the normal images (``NormalStatistics``), unless
``raw_errors``. Saved: the statistics' ``mean`` and ``scale`` (L,) and the checkpoint's fingerprint (the
whole MAE's: another decoder changes the errors)."""

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mae.apps.anomaly.evaluation import file_errors
from mae.apps.anomaly.masks import ComplementaryMasks, complementary_masks
from mae.apps.anomaly.saved_scorer import SavedScorer, check_saved_preprocessing, saved_checkpoint
from mae.apps.anomaly.scorers.base import ModelInputs, NormalImages, Reading, Scorer, ScorerSettings, option
from mae.apps.anomaly.scoring import NormalStatistics, reconstruction_errors
from mae.apps.embeddings.embedder import weights_fingerprint
from mae.convert.backbone import load_mae
from mae.convert.sources import read_checkpoint
from mae.errors import ConfigError, UsageError
from mae.inference.normalization import Normalization
from mae.models.mae import MaskedAutoencoderViT

DEFAULT_MASK_RATIO = 0.75
# Where the errors are measured, by the model's target (``mae.models.targets``); another target's own words.
_ERROR_SPACES = {"norm_pix": "per-patch normalised pixels (norm_pix_loss)", "pixel": "normalised pixels"}


@dataclass(frozen=True, kw_only=True)
class ReconstructionSettings(ScorerSettings):
    """``mask_ratio``: the fraction of patches each mask hides; ``repeats``: sets of complementary masks
    averaged; ``raw_errors``: the errors as they are, not standardised by normal images.

    Raises:
        UsageError: a ratio outside (0, 1), ``repeats`` or ``top_k`` below 1.
    """

    mask_ratio: float = option(
        DEFAULT_MASK_RATIO, float, f"fraction hidden by each mask (default {DEFAULT_MASK_RATIO})"
    )
    repeats: int = option(1, int, "sets of complementary masks averaged (default 1)")
    raw_errors: bool = option(False, bool, "score raw errors, not standardised by --normal")

    def __post_init__(self) -> None:
        if not 0 < self.mask_ratio < 1:  # NaN fails this too
            raise UsageError(
                "--mask-ratio must be in (0, 1), the fraction of patches each mask hides; got "
                f"{self.mask_ratio}"
            )
        if self.repeats < 1:
            raise UsageError(f"--repeats must be at least 1, got {self.repeats}")
        super().__post_init__()


@dataclass(kw_only=True)
class ReconstructionScorer(Scorer):
    """The MAE ``model`` (evaluation mode, on ``device``) and its complementary ``masks``."""

    name = "mae"
    summary = "the MAE's reconstruction error (the default)"
    Settings = ReconstructionSettings
    needs = {"checkpoint": ", an MAE with its decoder (or --method pixel-knn, the baseline that needs none)"}

    model: MaskedAutoencoderViT
    masks: ComplementaryMasks
    device: str

    def patch_errors(self, imgs: torch.Tensor) -> torch.Tensor:
        return reconstruction_errors(self.model, imgs.to(self.device), self.masks)

    @classmethod
    def check_fit(cls, settings: ReconstructionSettings, inputs: ModelInputs, normal: Path | None) -> None:
        super().check_fit(settings, inputs, normal)
        if normal is None and not settings.raw_errors:
            raise UsageError(
                "give --normal, a folder of defect-free images whose errors standardise the test errors, "
                "or --raw-errors to score the errors as they are"
            )

    @classmethod
    def fit(
        cls, settings: ReconstructionSettings, inputs: ModelInputs, normal: NormalImages, reading: Reading
    ) -> "ReconstructionScorer":
        """Raises:
        ConfigError: 1 normal image, or normal images whose errors do not vary, naming --normal.
        UsageError: a normalisation of another channel count than the model's."""
        if not settings.raw_errors and len(normal.images) == 1:
            raise ConfigError(
                f"{normal.folder} holds 1 image: per-patch statistics need at least 2 normal images (or pass "
                "--raw-errors)"
            )
        ckpt = read_checkpoint(inputs.checkpoint, reading.checkpoint_format)
        fingerprint = weights_fingerprint(ckpt, decoder=True)
        model, _ = load_mae(ckpt, **({"img_size": inputs.img_size} if inputs.img_size else {}))
        in_chans = model.config["in_chans"]
        norm = inputs.normalization(in_chans) or Normalization.of(ckpt.data, in_chans, str(inputs.checkpoint))
        scorer = cls._with_model(model, settings, norm, reading, inputs.checkpoint)
        if settings.raw_errors:
            normal = NormalImages(None, [])
            scorer.recorded["normal"] = None  # metrics.json: no normal images took part
        else:
            scorer._standardise(normal, reading)
        record = cls.fitted_record(
            asdict(settings),
            normal,
            scorer.size,
            norm,
            {"checkpoint": str(Path(inputs.checkpoint).resolve()), "fingerprint": fingerprint},
        )
        scorer.saved = SavedScorer(
            scorer._statistics_tensors(),
            {**record, "floored_positions": scorer.recorded["floored_positions"]},
        )
        return scorer

    @classmethod
    def load(
        cls, saved: SavedScorer, folder: Path, inputs: ModelInputs, reading: Reading
    ) -> "ReconstructionScorer":
        settings = cls.Settings.of(saved.record["settings"])
        size, norm = check_saved_preprocessing(saved, folder, inputs.img_size, inputs.mean, inputs.std)
        ckpt, _ = saved_checkpoint(saved, folder, inputs.checkpoint, reading.checkpoint_format, decoder=True)
        model, _ = load_mae(ckpt, img_size=size)
        checkpoint = inputs.checkpoint or Path(saved.record["encoder"]["checkpoint"])
        scorer = cls._with_model(model, settings, norm, reading, checkpoint, saved=saved, applied=folder)
        if not settings.raw_errors:
            tensors = saved.tensors
            statistics = NormalStatistics(
                tensors["mean"], tensors["scale"], saved.record["floored_positions"]
            )
            scorer._set_statistics(statistics)
            scorer.messages.append(f"scorer {folder}: the error statistics of {saved.record['normal']}")
        scorer.recorded.update(cls.applied_settings(saved, folder))
        return scorer

    @classmethod
    def _with_model(
        cls,
        model: MaskedAutoencoderViT,
        settings: ReconstructionSettings,
        norm: Normalization,
        reading: Reading,
        checkpoint: Path,
        saved: SavedScorer | None = None,
        applied: Path | None = None,
    ) -> "ReconstructionScorer":
        """The scorer of ``model`` under its masks, its errors raw until ``_set_statistics``.

        Raises:
            UsageError: ``norm`` of another channel count than the model's.
        """
        in_chans = model.config["in_chans"]
        if len(norm.mean) != in_chans or len(norm.std) != in_chans:
            raise UsageError(f"--mean and --std need {in_chans} values, one per channel of the model")
        model.eval().to(reading.device)
        generator = torch.Generator().manual_seed(settings.seed)
        masks = complementary_masks(model.grid_size, settings.mask_ratio, settings.repeats, generator)
        times = "time" if masks.hidden_count == 1 else "times"
        message = (
            f"{len(masks.noise)} complementary masks at ratio {settings.mask_ratio}: every patch hidden "
            f"{masks.hidden_count} {times}"
        )
        space = _ERROR_SPACES.get(model.target.name, model.target.described)
        recorded = {
            "checkpoint": str(checkpoint),
            "mask_ratio": settings.mask_ratio,
            "masks": len(masks.noise),
            "hidden_per_patch": masks.hidden_count,
            "seed": settings.seed,
            "standardised": False,
            "floored_positions": None,
            "error_space": space,
        }
        size = tuple(model.config["img_size"])
        return cls(
            settings=settings,
            size=size,
            grid_size=model.grid_size,
            norm=norm,
            saved=saved or SavedScorer({}, {}),
            recorded=recorded,
            messages=[message],
            applied=applied,
            model=model,
            masks=masks,
            device=reading.device,
        )

    def _standardise(self, normal: NormalImages, reading: Reading) -> None:
        """Standardise by the errors of the ``normal`` images (their statistics, and what is printed)."""
        errors = file_errors(
            self.patch_errors, normal.images, self.size, self.norm, reading.batch_size, reading.max_pixels
        )
        try:
            statistics = NormalStatistics.of(errors)
        except ValueError as err:
            raise ConfigError(
                f"--normal {normal.folder}: {err}; add varied defect-free images, or pass --raw-errors to "
                "score the errors as they are"
            ) from err
        self._set_statistics(statistics)
        self.messages.append(f"normal images: {len(normal.images)} ({normal.folder})")
        if statistics.floored:
            self.messages.append(
                f"note: at {statistics.floored} of {statistics.scale.numel()} patch positions the normal "
                f"images' errors vary less than {NormalStatistics.FLOOR} x their mean standard deviation "
                "over positions; their standard deviation is floored there"
            )

    def _set_statistics(self, statistics: NormalStatistics) -> None:
        self.statistics = statistics
        self.recorded.update(standardised=True, floored_positions=statistics.floored)

    def _statistics_tensors(self) -> dict[str, torch.Tensor]:
        if self.statistics is None:
            return {}
        return {"mean": self.statistics.mean, "scale": self.statistics.scale}
