"""``--method pixel-knn``: the baseline, no model. Each patch's squared difference to the same patch of the
nearest normal image (``mae.apps.anomaly.baseline``), raw, at ``--img-size``. Saved: the normal images
themselves, (M, C, H, W) normalised."""

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mae.apps.anomaly.baseline import nearest_normal_errors
from mae.apps.anomaly.evaluation import load_images
from mae.apps.anomaly.saved_scorer import SavedScorer, check_saved_preprocessing
from mae.apps.anomaly.scorers.base import ModelInputs, NormalImages, Reading, Scorer, ScorerSettings, option
from mae.errors import UsageError
from mae.inference.normalization import Normalization

KNN_PATCH_SIZE = 16  # the default patch: a ViT-B/16's


@dataclass(frozen=True, kw_only=True)
class PixelKnnSettings(ScorerSettings):
    """``patch_size``: the side of a scored patch, pixels.

    Raises:
        UsageError: a patch size or ``top_k`` below 1.
    """

    patch_size: int = option(
        KNN_PATCH_SIZE, int, f"the side of a scored patch, pixels (default {KNN_PATCH_SIZE})"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.patch_size < 1:
            raise UsageError(f"--patch-size must be a positive number of pixels, got {self.patch_size}")


@dataclass(kw_only=True)
class PixelKnnScorer(Scorer):
    """The (M, C, H, W) normalised normal images, ``reference``, each test image is compared with."""

    name = "pixel-knn"
    summary = "the squared difference to the nearest --normal image, per patch (no model; needs --img-size)"
    Settings = PixelKnnSettings
    needs = {
        "normal": ": the defect-free images each test image is compared with",
        "img_size": ": the size the images are compared at (there is no checkpoint to give it)",
    }

    reference: torch.Tensor

    def patch_errors(self, imgs: torch.Tensor) -> torch.Tensor:
        return nearest_normal_errors(imgs.to(self.reference.device), self.reference, self.settings.patch_size)

    @classmethod
    def check_apply(cls, inputs: ModelInputs) -> None:
        if inputs.checkpoint is not None:
            raise UsageError(
                "--method pixel-knn uses no checkpoint: leave out --checkpoint (give --img-size, and --mean "
                "/ --std for other statistics than ImageNet's)"
            )

    @classmethod
    def check_fit(cls, settings: PixelKnnSettings, inputs: ModelInputs, normal: Path | None) -> None:
        cls.check_apply(inputs)
        super().check_fit(settings, inputs, normal)
        if inputs.img_size % settings.patch_size:
            raise UsageError(
                f"--img-size {inputs.img_size} is not a multiple of the patch size {settings.patch_size}: "
                "choose --patch-size to divide it"
            )

    @classmethod
    def fit(
        cls, settings: PixelKnnSettings, inputs: ModelInputs, normal: NormalImages, reading: Reading
    ) -> "PixelKnnScorer":
        in_chans = len(inputs.mean) if inputs.mean else 3
        norm = inputs.normalization(in_chans) or Normalization.of(None, 3, "--method pixel-knn")
        size = (inputs.img_size, inputs.img_size)
        reference = load_images(normal.images, size, norm, reading.max_pixels).to(reading.device)
        record = cls.fitted_record(asdict(settings), normal, size, norm, None)
        count = len(normal.images)
        message = f"normal images: {count} ({normal.folder}): each test image compared with the nearest"
        return cls._of(
            settings, size, norm, reference, SavedScorer({"reference": reference}, record), [message]
        )

    @classmethod
    def load(
        cls, saved: SavedScorer, folder: Path, inputs: ModelInputs, reading: Reading
    ) -> "PixelKnnScorer":
        settings = cls.Settings.of(saved.record["settings"])
        size, norm = check_saved_preprocessing(saved, folder, inputs.img_size, inputs.mean, inputs.std)
        reference = saved.tensors["reference"].to(reading.device)
        message = f"scorer {folder}: {len(reference)} normal images of {saved.record['normal']}"
        scorer = cls._of(settings, size, norm, reference, saved, [message], applied=folder)
        scorer.recorded.update(cls.applied_settings(saved, folder))
        return scorer

    @classmethod
    def _of(
        cls,
        settings: PixelKnnSettings,
        size: tuple[int, int],
        norm: Normalization,
        reference: torch.Tensor,
        saved: SavedScorer,
        messages: list[str],
        applied: Path | None = None,
    ) -> "PixelKnnScorer":
        patch = settings.patch_size
        recorded = {"patch_size": patch, "standardised": False, "error_space": "normalised pixels"}
        grid = (size[0] // patch, size[1] // patch)
        return cls(
            settings=settings,
            size=size,
            grid_size=grid,
            norm=norm,
            saved=saved,
            recorded=recorded,
            messages=messages,
            applied=applied,
            reference=reference,
        )
