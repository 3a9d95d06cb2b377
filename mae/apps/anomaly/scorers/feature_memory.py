"""``--method features``: PatchCore (Roth et al., 2022) on the encoder's patch tokens: each patch's distance
to the nearest of a memory bank of the normal images' patch vectors (``mae.apps.anomaly.features``), maps
smoothed by a Gaussian of ``SIGMA`` pixels. Any encoder checkpoint ``mae embed`` reads. Saved: the (K, D)
bank and the encoder's fingerprint."""

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from mae.apps.anomaly.evaluation import file_errors
from mae.apps.anomaly.features import (
    DEFAULT_FRACTION,
    DEFAULT_NEIGHBOURHOOD,
    MAX_BLOCKS,
    SIGMA,
    FeatureMemory,
    coreset,
    default_feature_blocks,
    feature_blocks,
    feature_depth,
)
from mae.apps.anomaly.saved_scorer import SavedScorer, check_saved_preprocessing, saved_checkpoint
from mae.apps.anomaly.scorers.base import ModelInputs, NormalImages, Reading, Scorer, ScorerSettings, option
from mae.apps.embeddings.embedder import Embedder
from mae.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class FeatureMemorySettings(ScorerSettings):
    """``feature_blocks``: the encoder blocks whose patch tokens are concatenated (None: the last; a CNN's
    stages, None: its stride-8 and stride-16 ones, ``mae.apps.anomaly.features.CNN_FEATURE_BLOCKS``);
    ``neighbourhood``: patches averaged per side, odd; ``coreset_fraction``: of the normal patch vectors
    kept in the bank, in (0, 1]; ``seed``: the coreset's projection and first pick; ``top_k`` 1, the
    highest patch (PatchCore's image score).

    Raises:
        UsageError: an even or non-positive neighbourhood, a fraction outside (0, 1], ``top_k`` below 1.
    """

    top_k: int = 1
    feature_blocks: list[int] | None = option(
        None,
        int,
        "default: the last block; a CNN's -3 -2, its stride-8 and 16 stages (PatchCore's layer2 and layer3 "
        f"of a ResNet). 1 to {MAX_BLOCKS} blocks, their patch tokens concatenated (a CNN's maps resized to "
        "the finest chosen)",
        many=True,
    )
    neighbourhood: int = option(
        DEFAULT_NEIGHBOURHOOD,
        int,
        "each patch's vector averaged over this many patches per side, odd (default "
        f"{DEFAULT_NEIGHBOURHOOD}, as PatchCore; 1: none)",
    )
    coreset_fraction: float = option(
        DEFAULT_FRACTION,
        float,
        "the fraction of the normal patch vectors kept in the bank by a greedy coreset, in (0, 1] (default "
        f"{DEFAULT_FRACTION}; 1: all); --seed draws its projection and start",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.neighbourhood < 1 or self.neighbourhood % 2 == 0:
            raise UsageError(
                f"--neighbourhood must be an odd number of patches (1: none, 3: PatchCore's), got "
                f"{self.neighbourhood}"
            )
        if not 0 < self.coreset_fraction <= 1:
            raise UsageError(
                "--coreset-fraction must be in (0, 1], the fraction of the normal patch vectors kept in the "
                f"bank (1: all); got {self.coreset_fraction}"
            )


@dataclass(kw_only=True)
class FeatureMemoryScorer(Scorer):
    """The encoder's ``memory`` of normal patch vectors (``FeatureMemory``)."""

    name = "features"
    summary = (
        "each patch token's distance to the nearest of a memory bank of the --normal images' (PatchCore; any "
        "encoder checkpoint)"
    )
    Settings = FeatureMemorySettings
    sigma = SIGMA
    needs = {
        "checkpoint": ", the encoder whose patch tokens are compared (any checkpoint mae embed reads), or "
        "--scorer, a saved scorer",
        "normal": ", the defect-free images whose patch features make the memory bank (or --scorer, a saved "
        "scorer)",
    }

    memory: FeatureMemory

    def patch_errors(self, imgs: torch.Tensor) -> torch.Tensor:
        return self.memory.errors(imgs)

    @classmethod
    def fit(
        cls, settings: FeatureMemorySettings, inputs: ModelInputs, normal: NormalImages, reading: Reading
    ) -> "FeatureMemoryScorer":
        norm = inputs.normalization(len(inputs.mean or ()))
        embedder = reading.embedder(inputs.checkpoint, inputs.img_size, norm)
        chosen = settings.feature_blocks or default_feature_blocks(embedder.encoder)
        blocks = feature_blocks(chosen, feature_depth(embedder.encoder))
        settings = replace(settings, feature_blocks=blocks)
        memory = FeatureMemory(embedder.encoder, blocks, settings.neighbourhood)
        features = file_errors(
            memory.features,
            normal.images,
            embedder.img_size,
            embedder.norm,
            reading.batch_size,
            reading.max_pixels,
        )
        vectors = features.flatten(0, 1).to(embedder.device)
        memory.bank = vectors[coreset(vectors, settings.coreset_fraction, settings.seed)]
        message = (
            f"normal images: {len(normal.images)} ({normal.folder}): {len(vectors)} patch vectors of length "
            f"{vectors.shape[1]}, {len(memory.bank)} kept in the bank (greedy coreset, fraction "
            f"{settings.coreset_fraction})"
        )
        kept = {
            **asdict(settings),
            "sigma": SIGMA,
            "bank_size": len(memory.bank),
            "normal_patches": len(vectors),
        }
        identity = {"checkpoint": embedder.checkpoint, "fingerprint": embedder.fingerprint}
        record = cls.fitted_record(kept, normal, embedder.img_size, embedder.norm, identity)
        saved = SavedScorer({"bank": memory.bank.cpu()}, record)
        return cls._of(settings, embedder, memory, saved, message)

    @classmethod
    def load(
        cls, saved: SavedScorer, folder: Path, inputs: ModelInputs, reading: Reading
    ) -> "FeatureMemoryScorer":
        settings = cls.Settings.of(saved.record["settings"])
        size, norm = check_saved_preprocessing(saved, folder, inputs.img_size, inputs.mean, inputs.std)
        ckpt, fingerprint = saved_checkpoint(
            saved, folder, inputs.checkpoint, reading.checkpoint_format, decoder=False
        )
        embedder = reading.embedder(ckpt, size, norm, fingerprint)
        memory = FeatureMemory(embedder.encoder, settings.feature_blocks, settings.neighbourhood)
        memory.bank = saved.tensors["bank"].to(embedder.device)
        message = f"scorer {folder}: a bank of {len(memory.bank)} patch vectors of {saved.record['normal']}"
        scorer = cls._of(settings, embedder, memory, saved, message, applied=folder)
        scorer.recorded.update(cls.applied_settings(saved, folder))
        return scorer

    @classmethod
    def _of(
        cls,
        settings: FeatureMemorySettings,
        embedder: Embedder,
        memory: FeatureMemory,
        saved: SavedScorer,
        message: str,
        applied: Path | None = None,
    ) -> "FeatureMemoryScorer":
        recorded = {
            **saved.record["settings"],
            "checkpoint": embedder.checkpoint,
            "fingerprint": embedder.fingerprint,
            "standardised": False,
            "error_space": "Euclidean distance to the nearest normal patch feature",
        }
        return cls(
            settings=settings,
            size=embedder.img_size,
            grid_size=memory.grid_size(embedder.img_size, embedder.norm.in_chans),
            norm=embedder.norm,
            saved=saved,
            recorded=recorded,
            messages=[message],
            applied=applied,
            memory=memory,
        )
