"""The ways ``mae anomaly`` scores image files, each fitted on normal images or read from a saved scorer
(``saved_scorer``): ``mae_method`` (an MAE's reconstruction error, standardised by the normal images'
``NormalStatistics``), ``pixel_knn_method`` (the difference to the nearest normal image, ``baseline``) and
``features_method`` (PatchCore on the encoder's patch tokens, ``features``). Each returns a ``Method``: how
to turn images into per-patch errors, at which size and normalisation, and the ``SavedScorer`` that
``--save-scorer`` keeps. A saved scorer is applied only with its own preprocessing and weights
(``saved_scorer.check_saved_preprocessing``, ``saved_scorer.saved_checkpoint``)."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mae.apps.anomaly.baseline import knn_errors
from mae.apps.anomaly.evaluation import AnomalyResult, file_errors, load_images, mae_errors, score_test_set
from mae.apps.anomaly.features import DEFAULT_FRACTION, DEFAULT_NEIGHBOURHOOD, SIGMA, FeatureMemory, coreset
from mae.apps.anomaly.features import feature_blocks as chosen_blocks
from mae.apps.anomaly.layout import TestSet
from mae.apps.anomaly.masks import complementary_masks
from mae.apps.anomaly.saved_scorer import (
    SavedScorer,
    check_saved_preprocessing,
    preprocessing,
    saved_checkpoint,
)
from mae.apps.anomaly.scoring import NormalStatistics
from mae.apps.embeddings.embedder import load_embedder, weights_fingerprint
from mae.convert.backbone import load_mae
from mae.convert.sources import read_checkpoint
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import ConfigError, UsageError
from mae.inference.normalization import Normalization

MAE, PIXEL_KNN, FEATURES = "mae", "pixel-knn", "features"
KNN_PATCH_SIZE = 16  # pixel-knn's default patch: a ViT-B/16's


@dataclass(frozen=True)
class Reading:
    """How image files and checkpoints are read: ``batch_size`` images at a time, images over
    ``max_pixels`` pixels refused, the model on ``device``, checkpoints in ``checkpoint_format``."""

    device: str = "cpu"
    batch_size: int = 32
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    checkpoint_format: str = "auto"


@dataclass
class Method:
    """How images are scored: ``errors`` (N, C, H, W) -> (N, L) per-patch errors of images read at
    ``size`` (H, W) pixels with ``norm``; the (H/p, W/p) ``grid_size``; ``normal``: the statistics that
    standardise them (None: raw errors); ``settings``: what metrics.json records of it; ``sigma``: the
    maps' Gaussian smoothing in pixels (0: none); ``scorer``: what --save-scorer keeps, or the applied
    scorer; ``messages``: what the command prints about the fit."""

    errors: Callable[[torch.Tensor], torch.Tensor]
    size: tuple[int, int]
    grid_size: tuple[int, int]
    norm: Normalization
    normal: NormalStatistics | None
    settings: dict
    scorer: SavedScorer
    sigma: float = 0.0
    messages: list[str] = field(default_factory=list)

    def score(self, images: TestSet, top_k: int, reading: Reading) -> AnomalyResult:
        """Scores, maps and (labelled ``images``) metrics of ``images``: test, held-out normal and
        validation images alike; the image score the mean of the ``top_k`` highest patch scores."""
        paths = [i.path for i in images.images]
        errors = file_errors(self.errors, paths, self.size, self.norm, reading.batch_size, reading.max_pixels)
        return score_test_set(errors, images, self.grid_size, self.size, top_k, self.normal, self.sigma)


def _applied(saved: SavedScorer, scorer: Path) -> dict:
    """What metrics.json's settings add for an applied scorer: its folder and the normal images it was
    fitted on."""
    return {"scorer": str(scorer), "normal": saved.record["normal"]}


def _fitted_record(
    method: str,
    settings: dict,
    fit: list[Path],
    normal: Path | None,
    preprocessed: tuple[tuple[int, int], Normalization],
    encoder: dict | None,
) -> dict:
    """The record a fitted scorer of ``method`` is saved with (``save_scorer``): its ``settings``, the
    ``fit`` images of the folder ``normal`` it was fitted on, its (size, normalisation) and its model's
    ``encoder`` identity (checkpoint and fingerprint; None without a model); the decision is set later."""
    return {
        "method": method,
        "settings": settings,
        "normal": None if normal is None else str(normal),
        "normal_images": len(fit),
        "preprocessing": preprocessing(*preprocessed),
        "encoder": encoder,
        "decision": None,
    }


def mae_method(
    checkpoint: Path | None,
    fit: list[Path],
    normal: Path | None,
    reading: Reading,
    settings: dict,
    img_size: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    saved: SavedScorer | None = None,
    scorer: Path | None = None,
) -> Method:
    """The MAE's reconstruction errors under complementary masks, standardised by the errors of the ``fit``
    normal images (from the folder ``normal``) unless ``settings["raw_errors"]``, or ``saved``'s
    statistics (the scorer at ``scorer``).

    Args:
        settings: ``mask_ratio`` (fraction hidden by each mask), ``repeats`` (sets of masks), ``seed`` (of
            the masks), ``raw_errors``, ``top_k``; a saved scorer's own replace them.

    Raises:
        ConfigError: 1 normal image, or normal images whose errors do not vary (``NormalStatistics.of``),
            naming ``normal``; another checkpoint than ``saved``'s (``saved_checkpoint``).
        UsageError: a normalisation of another channel count than the model's; another size or
            normalisation than ``saved``'s.
    """
    if saved is not None:
        settings = saved.record["settings"]
        size, norm = check_saved_preprocessing(saved, scorer, img_size, mean, std)
        ckpt, fingerprint = saved_checkpoint(
            saved, scorer, checkpoint, reading.checkpoint_format, decoder=True
        )
        model, _ = load_mae(ckpt, img_size=size)
    else:
        if not settings["raw_errors"] and len(fit) == 1:
            raise ConfigError(
                f"{normal} holds 1 image: per-patch statistics need at least 2 normal images (or pass "
                "--raw-errors)"
            )
        ckpt = read_checkpoint(checkpoint, reading.checkpoint_format)
        fingerprint = weights_fingerprint(ckpt, decoder=True)
        model, _ = load_mae(ckpt, **({"img_size": img_size} if img_size else {}))
        in_chans, size = model.config["in_chans"], tuple(model.config["img_size"])
        if mean:
            norm = Normalization(in_chans, tuple(mean), tuple(std))
        else:
            norm = Normalization.of(ckpt.data, in_chans, str(checkpoint))
    in_chans = model.config["in_chans"]
    if len(norm.mean) != in_chans or len(norm.std) != in_chans:
        raise UsageError(f"--mean and --std need {in_chans} values, one per channel of the model")
    model.eval().to(reading.device)
    masks = complementary_masks(
        model.grid_size,
        settings["mask_ratio"],
        settings["repeats"],
        torch.Generator().manual_seed(settings["seed"]),
    )
    errors = mae_errors(model, masks, reading.device)
    times = "time" if masks.hidden_count == 1 else "times"
    messages = [
        f"{len(masks.noise)} complementary masks at ratio {settings['mask_ratio']}: every patch hidden "
        f"{masks.hidden_count} {times}"
    ]
    statistics = None
    if saved is not None and not settings["raw_errors"]:
        tensors = saved.tensors
        statistics = NormalStatistics(tensors["mean"], tensors["scale"], saved.record["floored_positions"])
        messages.append(f"scorer {scorer}: the error statistics of {saved.record['normal']}")
    elif not settings["raw_errors"]:
        normal_errors = file_errors(errors, fit, size, norm, reading.batch_size, reading.max_pixels)
        try:
            statistics = NormalStatistics.of(normal_errors)
        except ValueError as err:
            raise ConfigError(
                f"--normal {normal}: {err}; add varied defect-free images, or pass --raw-errors to score the "
                "errors as they are"
            ) from err
        messages.append(f"normal images: {len(fit)} ({normal})")
        if statistics.floored:
            messages.append(
                f"note: at {statistics.floored} of {statistics.scale.numel()} patch positions the normal "
                f"images' errors vary less than {NormalStatistics.FLOOR} x their mean standard deviation "
                "over positions; their standard deviation is floored there"
            )
    path = checkpoint or Path(saved.record["encoder"]["checkpoint"])
    recorded = {
        "checkpoint": str(path),
        "mask_ratio": settings["mask_ratio"],
        "masks": len(masks.noise),
        "hidden_per_patch": masks.hidden_count,
        "seed": settings["seed"],
        "standardised": not settings["raw_errors"],
        "floored_positions": statistics.floored if statistics else None,
        "error_space": "per-patch normalised pixels (norm_pix_loss)"
        if model.norm_pix_loss
        else "normalised pixels",
        **(_applied(saved, scorer) if saved is not None else {}),
    }
    if saved is None:
        tensors = {"mean": statistics.mean, "scale": statistics.scale} if statistics else {}
        keep = ("mask_ratio", "repeats", "seed", "raw_errors", "top_k")
        record = _fitted_record(
            MAE,
            {k: settings[k] for k in keep},
            [] if settings["raw_errors"] else fit,
            None if settings["raw_errors"] else normal,
            (size, norm),
            {"checkpoint": str(Path(checkpoint).resolve()), "fingerprint": fingerprint},
        )
        saved = SavedScorer(tensors, {**record, "floored_positions": recorded["floored_positions"]})
    return Method(errors, size, model.grid_size, norm, statistics, recorded, saved, messages=messages)


def pixel_knn_method(
    fit: list[Path],
    normal: Path | None,
    reading: Reading,
    settings: dict,
    img_size: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    saved: SavedScorer | None = None,
    scorer: Path | None = None,
) -> Method:
    """The baseline: each patch's squared difference to the nearest of the ``fit`` normal images (from the
    folder ``normal``), or of ``saved``'s reference images, raw, at ``img_size`` x ``img_size`` pixels.

    Args:
        settings: ``patch_size`` (the side of a scored patch, pixels; None: ``KNN_PATCH_SIZE``), ``seed``,
            ``top_k``; a saved scorer's own replace them.
    """
    if saved is not None:
        settings = saved.record["settings"]
        size, norm = check_saved_preprocessing(saved, scorer, img_size, mean, std)
        reference = saved.tensors["reference"].to(reading.device)
        messages = [f"scorer {scorer}: {len(reference)} normal images of {saved.record['normal']}"]
    else:
        settings = {**settings, "patch_size": settings["patch_size"] or KNN_PATCH_SIZE}
        if mean:
            norm = Normalization(len(mean), tuple(mean), tuple(std))
        else:
            norm = Normalization.of(None, 3, "--method pixel-knn")  # RGB, ImageNet's statistics
        size = (img_size, img_size)
        reference = load_images(fit, size, norm, reading.max_pixels).to(reading.device)
        messages = [f"normal images: {len(fit)} ({normal}): each test image compared with the nearest"]
    patch = settings["patch_size"]
    recorded = {"patch_size": patch, "standardised": False, "error_space": "normalised pixels"}
    if saved is None:
        settings_kept = {k: settings[k] for k in ("patch_size", "seed", "top_k")}
        record = _fitted_record(PIXEL_KNN, settings_kept, fit, normal, (size, norm), None)
        saved = SavedScorer({"reference": reference}, record)
    else:
        recorded.update(_applied(saved, scorer))
    grid = (size[0] // patch, size[1] // patch)
    return Method(knn_errors(reference, patch), size, grid, norm, None, recorded, saved, messages=messages)


def features_method(
    checkpoint: Path | None,
    fit: list[Path],
    normal: Path | None,
    reading: Reading,
    settings: dict,
    img_size: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    saved: SavedScorer | None = None,
    scorer: Path | None = None,
) -> Method:
    """PatchCore on the encoder's patch tokens: the bank fitted on the ``fit`` normal images (from the
    folder ``normal``), or ``saved``'s, whose encoder and preprocessing must be this run's.

    Args:
        settings: ``feature_blocks`` (None: the last), ``neighbourhood`` and ``coreset_fraction`` (None:
            the defaults), ``seed`` (of the coreset), ``top_k``; a saved scorer's own replace them.
    """
    if saved is None:
        norm = Normalization(len(mean), tuple(mean), tuple(std)) if mean else None
        embedder = load_embedder(
            checkpoint,
            format=reading.checkpoint_format,
            img_size=img_size,
            norm=norm,
            device=reading.device,
            max_pixels=reading.max_pixels,
        )
        settings = {
            "feature_blocks": chosen_blocks(settings["feature_blocks"], len(embedder.encoder.blocks)),
            "neighbourhood": settings["neighbourhood"] or DEFAULT_NEIGHBOURHOOD,
            "coreset_fraction": settings["coreset_fraction"] or DEFAULT_FRACTION,
            "seed": settings["seed"],
            "top_k": settings["top_k"],
            "sigma": SIGMA,
        }
    else:
        size, norm = check_saved_preprocessing(saved, scorer, img_size, mean, std)
        ckpt, fingerprint = saved_checkpoint(
            saved, scorer, checkpoint, reading.checkpoint_format, decoder=False
        )
        embedder = load_embedder(
            ckpt,
            format=reading.checkpoint_format,
            img_size=size,
            norm=norm,
            device=reading.device,
            max_pixels=reading.max_pixels,
            fingerprint=fingerprint,
        )
        settings = saved.record["settings"]
    memory = FeatureMemory(embedder.encoder, settings["feature_blocks"], settings["neighbourhood"])
    if saved is None:
        features = file_errors(
            memory.features, fit, embedder.img_size, embedder.norm, reading.batch_size, reading.max_pixels
        )
        vectors = features.flatten(0, 1).to(embedder.device)
        memory.bank = vectors[coreset(vectors, settings["coreset_fraction"], settings["seed"])]
        message = (
            f"normal images: {len(fit)} ({normal}): {len(vectors)} patch vectors of length "
            f"{vectors.shape[1]}, {len(memory.bank)} kept in the bank (greedy coreset, fraction "
            f"{settings['coreset_fraction']})"
        )
        record = _fitted_record(
            FEATURES,
            {**settings, "bank_size": len(memory.bank), "normal_patches": len(vectors)},
            fit,
            normal,
            (embedder.img_size, embedder.norm),
            {"checkpoint": embedder.checkpoint, "fingerprint": embedder.fingerprint},
        )
        saved = SavedScorer({"bank": memory.bank.cpu()}, record)
    else:
        memory.bank = saved.tensors["bank"].to(embedder.device)
        message = f"scorer {scorer}: a bank of {len(memory.bank)} patch vectors of {saved.record['normal']}"
    grid = tuple(embedder.encoder.patch_embed.grid_size)
    recorded = {
        **saved.record["settings"],
        "checkpoint": embedder.checkpoint,
        "fingerprint": embedder.fingerprint,
        "standardised": False,
        "error_space": "Euclidean distance to the nearest normal patch feature",
        **(_applied(saved, scorer) if scorer is not None else {}),
    }
    return Method(
        memory.errors, embedder.img_size, grid, embedder.norm, None, recorded, saved, SIGMA, [message]
    )
