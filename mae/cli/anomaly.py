"""``mae anomaly --checkpoint C --normal ROOT --test ROOT --out DIR``: anomaly scores and heat maps
from an MAE's reconstruction error, and AUROC / AUPRO when the test folder is labelled (MVTec AD layout).
``--method pixel-knn`` scores the same way by the difference to the nearest normal image instead (the
baseline, no checkpoint), with the same outputs, so any folder can be compared with it."""

import csv
import io
import json
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from jsonargparse import ArgumentParser

from mae.apps.anomaly.baseline import knn_errors
from mae.apps.anomaly.evaluation import (
    AnomalyResult,
    file_errors,
    load_images,
    mae_errors,
    relative_name,
    score_test_set,
)
from mae.apps.anomaly.figures import color_range, heat_map_figure
from mae.apps.anomaly.layout import GOOD, TestSet, normal_images, read_test_set
from mae.apps.anomaly.masks import complementary_masks
from mae.apps.anomaly.scoring import NormalStatistics
from mae.command import command_parser, parse_and_run
from mae.command_options import add_option, argparse_float, argparse_int
from mae.convert.sources import FORMATS
from mae.data import DEFAULT_MAX_PIXELS
from mae.errors import ConfigError, UsageError
from mae.inference.images import display_range
from mae.inference.normalization import Normalization
from mae.inference.reconstruction import load_reconstructor
from mae.io.atomic import atomic_write
from mae.io.outputs import Output, check_outputs, claim_folder

COMMAND = "mae.anomaly"
FIGURES = ("all", "overview", "none")
MAE, PIXEL_KNN = "mae", "pixel-knn"
KNN_PATCH_SIZE = 16  # pixel-knn's default patch: a ViT-B/16's
OVERVIEW_PER_KIND = 4  # images of each class folder in overview.png


def build_parser() -> ArgumentParser:
    parser = command_parser(
        "mae anomaly",
        "Score test images for anomalies by an MAE's reconstruction error: every patch hidden by "
        "complementary masks and rebuilt from its context, its error standardised by the errors of normal "
        "images; write scores, heat maps and, for a labelled test folder (MVTec AD layout), image AUROC, "
        "pixel AUROC and AUPRO. --method pixel-knn: the baseline, each patch's difference to the nearest "
        "normal image, no checkpoint.",
    )
    parser.add_argument(
        "--method",
        choices=(MAE, PIXEL_KNN),
        default=MAE,
        help="mae: the MAE's reconstruction error; pixel-knn: the squared difference to the nearest "
        "--normal image, per patch (no model; needs --img-size)",
    )
    add_option(
        parser,
        "checkpoint",
        "--method mae: a checkpoint with a decoder (ours, official full, Hugging Face)",
        default=None,
    )
    add_option(parser, "checkpoint_format", choices=FORMATS)
    parser.add_argument(
        "--normal",
        type=Path,
        default=None,
        help="defect-free images (e.g. <category>/train/good): their per-patch errors standardise "
        "the test errors (required unless --raw-errors); pixel-knn: the images compared "
        "with",
    )
    parser.add_argument(
        "--test",
        type=Path,
        required=True,
        help="test images: <category>/test with good/ and one folder per defect, or a folder of "
        "images (no labels, no metrics)",
    )
    parser.add_argument(
        "--ground-truth",
        type=Path,
        default=None,
        help="masks <defect>/<name>_mask.png (default: <test>/../ground_truth if there)",
    )
    add_option(parser, "out", "output folder", required=True)
    parser.add_argument(
        "--mask-ratio", type=argparse_float, default=0.75, help="fraction hidden by each mask"
    )
    parser.add_argument(
        "--repeats", type=argparse_int, default=1, help="sets of complementary masks averaged"
    )
    parser.add_argument(
        "--top-k", type=argparse_int, default=4, help="image score: mean of the k highest patches"
    )
    parser.add_argument("--seed", type=argparse_int, default=0, help="seed of the masks")
    parser.add_argument(
        "--raw-errors",
        action="store_true",
        help="score raw errors, not standardised by --normal (pixel-knn: always raw)",
    )
    parser.add_argument(
        "--figures",
        choices=FIGURES,
        default="all",
        help="a heat-map figure per test image and overview.png (all), the overview, none",
    )
    add_option(parser, "batch_size", default=32)
    add_option(parser, "device", "where the model runs")
    add_option(parser, "img_size", "default: the checkpoint's; pixel-knn: required")
    parser.add_argument(
        "--patch-size",
        type=argparse_int,
        default=None,
        help=f"pixel-knn: the side of a scored patch (default {KNN_PATCH_SIZE}; mae: the model's)",
    )
    add_option(parser, "mean", "default: the checkpoint's record; pixel-knn: ImageNet's, RGB")
    add_option(parser, "std", "default: the checkpoint's record; pixel-knn: ImageNet's, RGB")
    add_option(
        parser,
        "max_image_pixels",
        "larger images are refused as decompression bombs",
        default=DEFAULT_MAX_PIXELS,
    )
    return parser


@dataclass
class Method:
    """How the test images are scored: ``errors`` (N, C, H, W) -> (N, L) per-patch errors of images read at
    ``size`` with ``norm``; the (H/p, W/p) ``grid_size``; ``normal``: the statistics that standardise them
    (None: raw errors); ``settings``: what metrics.json records of it."""

    errors: Callable[[torch.Tensor], torch.Tensor]
    size: tuple[int, int]
    grid_size: tuple[int, int]
    norm: Normalization
    normal: NormalStatistics | None
    settings: dict


def run(args: Namespace) -> AnomalyResult:
    """Score the test images and write ``scores.csv``, the figures and (labelled tests) ``metrics.json``.

    Raises:
        UsageError: a bad number (ratio outside (0, 1), repeats, top-k, batch size or size below 1),
            --mean without --std, statistics of another channel count than the model's, or a flag the
            method needs missing (mae: --checkpoint; pixel-knn: --normal, --img-size).
        ValueError: the normal images identical (no spread to standardise by), naming --normal.
    """
    _check(args)
    inputs = [args.test, args.test.parent / "ground_truth", args.checkpoint, args.normal, args.ground_truth]
    check_outputs(COMMAND, [Output(args.out, "--out", kind="folder")], [p for p in inputs if p is not None])
    test_set = read_test_set(args.test, args.ground_truth)  # the folders first: no model loaded in vain
    if test_set.unused_masks:
        count = len(test_set.unused_masks)
        print(
            f"note: {count} ground-truth {'mask matches' if count == 1 else 'masks match'} no test image and "
            f"{'is' if count == 1 else 'are'} not used: {', '.join(map(str, test_set.unused_masks))} (the "
            "mask of <test>/<defect>/<name>.png is <ground truth>/<defect>/<name>_mask.png)"
        )
    method = _mae(args) if args.method == MAE else _pixel_knn(args)
    paths = [i.path for i in test_set.images]
    test_errors = file_errors(
        method.errors, paths, method.size, method.norm, args.batch_size, args.max_image_pixels
    )
    result = score_test_set(test_errors, test_set, method.grid_size, method.size, args.top_k, method.normal)

    claim_folder(args.out, COMMAND)
    if args.figures != "none":
        _write_figures(args, test_set, result, method.size, method.norm)
    atomic_write(args.out / "scores.csv", lambda tmp: tmp.write_text(_scores_csv(test_set, result)))
    if result.metrics is not None:
        normal = None if args.method == MAE and args.raw_errors else str(args.normal)
        settings = {
            "method": args.method,
            "normal": normal,
            "test": str(args.test),
            "top_k": args.top_k,
            **method.settings,
            "metric_size": list(method.size),
        }
        record = {**result.metrics, "settings": settings}
        atomic_write(
            args.out / "metrics.json", lambda tmp: tmp.write_text(json.dumps(record, indent=2) + "\n")
        )
        _print_metrics(result.metrics)
    print(f"wrote {args.out}")
    return result


def _mae(args: Namespace) -> Method:
    """The MAE's reconstruction errors under complementary masks, standardised by --normal's unless
    --raw-errors."""
    normal = [] if args.raw_errors else normal_images(args.normal)
    if len(normal) == 1:
        raise ConfigError(
            f"{args.normal} holds 1 image: per-patch statistics need at least 2 normal images (or "
            f"pass --raw-errors)"
        )
    model, norm = load_reconstructor(
        args.checkpoint, args.checkpoint_format, args.img_size, args.mean, args.std
    )
    in_chans = model.config["in_chans"]
    if len(norm.mean) != in_chans or len(norm.std) != in_chans:
        raise UsageError(f"--mean and --std need {in_chans} values, one per channel of the model")
    model.to(args.device)
    size = tuple(model.config["img_size"])
    masks = complementary_masks(
        model.grid_size, args.mask_ratio, args.repeats, torch.Generator().manual_seed(args.seed)
    )
    errors = mae_errors(model, masks, args.device)
    times = "time" if masks.hidden_count == 1 else "times"
    print(
        f"{len(masks.noise)} complementary masks at ratio {args.mask_ratio}: every patch hidden "
        f"{masks.hidden_count} {times}"
    )
    statistics = None
    if not args.raw_errors:
        normal_errors = file_errors(errors, normal, size, norm, args.batch_size, args.max_image_pixels)
        try:
            statistics = NormalStatistics.of(normal_errors)
        except ValueError as err:
            raise ConfigError(
                f"--normal {args.normal}: {err}; add varied defect-free images, or pass --raw-errors "
                f"to score the errors as they are"
            ) from err
        print(f"normal images: {len(normal)} ({args.normal})")
        if statistics.floored:
            print(
                f"note: at {statistics.floored} of {statistics.scale.numel()} patch positions the normal "
                f"images' errors vary less than {NormalStatistics.FLOOR} x their mean standard deviation "
                "over positions; their standard deviation is floored there"
            )
    settings = {
        "checkpoint": str(args.checkpoint),
        "mask_ratio": args.mask_ratio,
        "masks": len(masks.noise),
        "hidden_per_patch": masks.hidden_count,
        "seed": args.seed,
        "standardised": not args.raw_errors,
        "floored_positions": statistics.floored if statistics else None,
        "error_space": "per-patch normalised pixels (norm_pix_loss)"
        if model.norm_pix_loss
        else "normalised pixels",
    }
    return Method(errors, size, model.grid_size, norm, statistics, settings)


def _pixel_knn(args: Namespace) -> Method:
    """The baseline: each patch's squared difference to the nearest --normal image, raw, at --img-size."""
    if args.mean:
        norm = Normalization(len(args.mean), tuple(args.mean), tuple(args.std))
    else:
        norm = Normalization.of(None, 3, "--method pixel-knn")  # RGB, ImageNet's statistics
    size, patch = (args.img_size, args.img_size), args.patch_size or KNN_PATCH_SIZE
    normal = normal_images(args.normal)
    reference = load_images(normal, size, norm, args.max_image_pixels).to(args.device)
    print(f"normal images: {len(normal)} ({args.normal}): each test image compared with the nearest")
    settings = {"patch_size": patch, "standardised": False, "error_space": "normalised pixels"}
    grid = (args.img_size // patch, args.img_size // patch)
    return Method(knn_errors(reference, patch), size, grid, norm, None, settings)


def _check(args: Namespace) -> None:
    if not 0 < args.mask_ratio < 1:  # NaN fails this too
        raise UsageError(
            f"--mask-ratio must be in (0, 1), the fraction of patches each mask hides; got {args.mask_ratio}"
        )
    for flag in ("repeats", "top_k", "batch_size"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    for flag in ("img_size", "patch_size"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise UsageError(
                f"--{flag.replace('_', '-')} must be a positive number of pixels, got {getattr(args, flag)}"
            )
    if (args.mean is None) != (args.std is None):
        raise UsageError("give --mean and --std together")
    if args.method == PIXEL_KNN:
        _check_pixel_knn(args)
        return
    if args.checkpoint is None:
        raise UsageError(
            f"--method {MAE} needs --checkpoint, an MAE with its decoder (or --method {PIXEL_KNN}, "
            f"the baseline that needs none)"
        )
    if args.patch_size is not None:
        raise UsageError(f"--patch-size is for --method {PIXEL_KNN}; the MAE's patches are its checkpoint's")
    if args.normal is None and not args.raw_errors:
        raise UsageError(
            "give --normal, a folder of defect-free images whose errors standardise the test errors, "
            "or --raw-errors to score the errors as they are"
        )


def _check_pixel_knn(args: Namespace) -> None:
    if args.checkpoint is not None:
        raise UsageError(
            f"--method {PIXEL_KNN} uses no checkpoint: leave out --checkpoint (give --img-size, and "
            f"--mean / --std for other statistics than ImageNet's)"
        )
    if args.normal is None:
        raise UsageError(
            f"--method {PIXEL_KNN} needs --normal: the defect-free images each test image is compared with"
        )
    if args.img_size is None:
        raise UsageError(
            f"--method {PIXEL_KNN} needs --img-size: the size the images are compared at (there is no "
            f"checkpoint to give it)"
        )
    if args.mean is not None and len(args.mean) != len(args.std):
        raise UsageError(
            f"--mean and --std need one value per channel each; got {len(args.mean)} and {len(args.std)}"
        )
    patch = args.patch_size or KNN_PATCH_SIZE
    if args.img_size % patch:
        raise UsageError(
            f"--img-size {args.img_size} is not a multiple of the patch size {patch}: choose "
            f"--patch-size to divide it"
        )


def _write_figures(
    args: Namespace, test_set: TestSet, result: AnomalyResult, size: tuple[int, int], norm
) -> None:
    colors = color_range(result.maps)
    paths = [i.path for i in test_set.images]
    value_range = display_range(paths)

    def figure(picks: list[int]):
        imgs = load_images([paths[i] for i in picks], size, norm, args.max_image_pixels)
        truth = result.truth[picks] if result.truth is not None else None
        names = [relative_name(paths[i], test_set.root) for i in picks]
        return heat_map_figure(
            imgs, result.maps[picks], names, result.scores[picks].tolist(), norm, colors, truth, value_range
        )

    if args.figures == "all":
        for i, path in enumerate(paths):
            name = relative_name(path, test_set.root)
            target = args.out / "heatmaps" / (name if path.suffix.lower() == ".png" else f"{name}.png")
            image = figure([i])
            atomic_write(target, lambda tmp, image=image: image.save(tmp, format="PNG"))
    picks = []
    for kind in test_set.kinds if test_set.labelled else [None]:
        picks += [j for j, image in enumerate(test_set.images) if image.kind == kind][:OVERVIEW_PER_KIND]
    overview = figure(picks)
    atomic_write(args.out / "overview.png", lambda tmp: overview.save(tmp, format="PNG"))


def _scores_csv(test_set: TestSet, result: AnomalyResult) -> str:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["path", "kind", "label", "score"])
    for image, score in zip(test_set.images, result.scores.tolist(), strict=True):
        label = "" if image.label is None else image.label
        writer.writerow([relative_name(image.path, test_set.root), image.kind or "", label, f"{score:.6g}"])
    return text.getvalue()


def _print_metrics(metrics: dict) -> None:
    counts = ", ".join(f"{kind} {n}" for kind, n in metrics["images"].items())
    print(f"test images: {counts}")
    for name in ("image_auroc", "pixel_auroc", "aupro"):
        if name in metrics:
            print(f"{name}: {metrics[name]:.4f}")
    for kind, value in metrics.get("image_auroc_per_kind", {}).items():
        print(f"image_auroc {GOOD} vs {kind}: {value:.4f}")
    reasons: dict[str, list[str]] = {}  # the metrics that share a reason, on one line
    for name, reason in metrics.get("not_computed", {}).items():
        reasons.setdefault(reason, []).append(name)
    for reason, names in reasons.items():
        print(f"note: {', '.join(names)} not computed: {reason}")


def main(argv: list[str] | None = None) -> AnomalyResult:
    return parse_and_run(build_parser(), run, argv)
