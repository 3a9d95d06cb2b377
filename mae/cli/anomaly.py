"""``mae anomaly --checkpoint C --normal ROOT --test ROOT --out DIR``: anomaly scores and heat maps
from an MAE's reconstruction error, and AUROC / AUPRO when the test folder is labelled (MVTec AD layout).
``--method pixel-knn`` scores the same way by the difference to the nearest normal image instead (the
baseline, no checkpoint), with the same outputs, so any folder can be compared with it. ``--method features``
scores each patch token's distance to a memory bank of the normal images' (PatchCore). ``--save-scorer`` /
``--scorer`` keep any method's fitted scorer and apply it later without ``--normal``.

This module holds the command line: the flags, the run's order and what it prints. The flags' checks are
``mae.cli.anomaly_checks``, the methods ``mae.apps.anomaly.methods``, the decision's data
``mae.apps.anomaly.decision``, the files ``mae.apps.anomaly.outputs``."""

import json
from argparse import Namespace
from pathlib import Path

import torch
from jsonargparse import ArgumentParser

from mae.apps.anomaly.decision import (
    DEFAULT_HOLDOUT,
    MIN_HOLDOUT,
    choose_decision,
    split_normal,
    validation_set,
)
from mae.apps.anomaly.evaluation import AnomalyResult
from mae.apps.anomaly.features import DEFAULT_FRACTION, DEFAULT_NEIGHBOURHOOD, MAX_BLOCKS
from mae.apps.anomaly.layout import GOOD, read_test_set
from mae.apps.anomaly.methods import (
    FEATURES,
    KNN_PATCH_SIZE,
    MAE,
    PIXEL_KNN,
    Method,
    Reading,
    features_method,
    mae_method,
    pixel_knn_method,
)
from mae.apps.anomaly.outputs import scores_csv, write_figures
from mae.apps.anomaly.saved_scorer import SavedScorer, save_scorer, scorer_output
from mae.apps.anomaly.threshold import DEFAULT_QUANTILE, Decision, decision_metrics
from mae.cli.anomaly_checks import DEFAULTS, FIXED, check_args, resolve_method
from mae.cli.command import command_parser, parse_and_run
from mae.cli.command_options import add_option, argparse_float, argparse_int
from mae.convert.sources import FORMATS
from mae.data import DEFAULT_MAX_PIXELS
from mae.io.atomic import atomic_write
from mae.io.outputs import Output, check_outputs, claim_folder

COMMAND = "mae.anomaly"
FIGURES = ("all", "overview", "none")


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
        choices=(MAE, PIXEL_KNN, FEATURES),
        default=None,
        help="mae (the default): the MAE's reconstruction error; pixel-knn: the squared difference to the "
        "nearest --normal image, per patch (no model; needs --img-size); features: each patch token's "
        "distance to the nearest of a memory bank of the --normal images' (PatchCore; any encoder "
        "checkpoint); with --scorer: the scorer's",
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
        "--mask-ratio",
        type=argparse_float,
        default=None,
        help=f"fraction hidden by each mask (default {DEFAULTS['mask_ratio']})",
    )
    parser.add_argument(
        "--repeats",
        type=argparse_int,
        default=None,
        help=f"sets of complementary masks averaged (default {DEFAULTS['repeats']})",
    )
    parser.add_argument(
        "--top-k",
        type=argparse_int,
        default=None,
        help="image score: mean of the k highest patches (default 4; features: 1, the highest, as PatchCore)",
    )
    parser.add_argument(
        "--seed",
        type=argparse_int,
        default=None,
        help=f"draws everything random (default {DEFAULTS['seed']}; with --scorer, the scorer's): mae's "
        "masks, the --holdout images and, for features, the coreset's random projection and its first pick",
    )
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
    _add_decision_arguments(parser)
    _add_feature_arguments(parser)
    return parser


def _add_decision_arguments(parser: ArgumentParser) -> None:
    """The flags of the decision (``mae.apps.anomaly.decision``): where its thresholds come from."""
    parser.add_argument(
        "--holdout",
        type=argparse_float,
        default=DEFAULT_HOLDOUT,
        help=f"fraction of the --normal images held out from fitting (at least {MIN_HOLDOUT}, chosen by "
        "--seed) and scored like test images: their --threshold-quantile is the threshold; 0: none held "
        "out (no decision without --validation)",
    )
    parser.add_argument(
        "--threshold-quantile",
        type=argparse_float,
        default=DEFAULT_QUANTILE,
        help="the quantile of the held-out normal images' scores (and of their heat maps' pixels) taken "
        "as the image (pixel) threshold: 1 = their maximum",
    )
    parser.add_argument(
        "--validation",
        type=Path,
        default=None,
        help="a labelled validation folder in the --test layout (good/ and a folder per defect; masks "
        "from <validation>/../ground_truth if there): the thresholds that maximise F1 on it; nothing is "
        "held out",
    )


def _add_feature_arguments(parser: ArgumentParser) -> None:
    """The flags of ``--method features`` (``mae.apps.anomaly.features``) and of saved scorers."""
    parser.add_argument(
        "--feature-blocks",
        type=argparse_int,
        nargs="+",
        default=None,
        help=f"features: the encoder blocks whose patch tokens are concatenated, 1 to {MAX_BLOCKS} (0 the "
        "first, -1 the last; default: the last)",
    )
    parser.add_argument(
        "--neighbourhood",
        type=argparse_int,
        default=None,
        help=f"features: each patch's vector averaged over this many patches per side, odd (default "
        f"{DEFAULT_NEIGHBOURHOOD}, as PatchCore; 1: none)",
    )
    parser.add_argument(
        "--coreset-fraction",
        type=argparse_float,
        default=None,
        help=f"features: the fraction of the normal patch vectors kept in the bank by a greedy coreset, in "
        f"(0, 1] (default {DEFAULT_FRACTION}; 1: all); --seed draws its projection and start",
    )
    parser.add_argument(
        "--save-scorer",
        type=Path,
        default=None,
        help="write the fitted scorer to this folder, as safetensors + JSON, to apply later with --scorer: "
        "the feature bank (features), the normal error statistics (mae) or the normal images (pixel-knn), "
        "the settings, preprocessing, model identity and threshold",
    )
    parser.add_argument(
        "--scorer",
        type=Path,
        default=None,
        help="a folder --save-scorer wrote: score --test with it, no --normal (mae, features: the model is "
        "its recorded checkpoint, or --checkpoint with the same weights)",
    )


def run(args: Namespace) -> AnomalyResult:
    """Score the test images and write ``scores.csv``, the figures and (labelled tests) ``metrics.json``;
    decide which are anomalous at a threshold chosen on held-out normal images or on --validation.

    Raises:
        UsageError: a bad number (ratio outside (0, 1), repeats, top-k, batch size or size below 1),
            --mean without --std, statistics of another channel count than the model's, or a flag the
            method needs missing (mae: --checkpoint; pixel-knn: --normal, --img-size; features:
            --checkpoint and --normal; or --scorer); --scorer with a flag that would refit or change it,
            or with another size or normalisation than its own.
        ConfigError: the normal images identical (no spread to standardise by), naming --normal; too few
            to hold some out and fit on the rest; a model with other weights than --scorer's.
        InputError: a --validation folder without good and defective images.
    """
    saved = resolve_method(args)  # --scorer: read first, it fixes the method and its settings
    check_args(args)
    inputs = [args.test, args.test.parent / "ground_truth", args.checkpoint, args.normal, args.ground_truth]
    inputs += [args.validation, args.validation.parent / "ground_truth"] if args.validation else []
    outputs = [Output(args.out, "--out", kind="folder")]
    outputs += [scorer_output(args.save_scorer)] if args.save_scorer else []
    inputs += [args.scorer] if args.scorer else []
    check_outputs(COMMAND, outputs, [p for p in inputs if p is not None])
    test_set = read_test_set(args.test, args.ground_truth)  # the folders first: no model loaded in vain
    if test_set.unused_masks:
        count = len(test_set.unused_masks)
        print(
            f"note: {count} ground-truth {'mask matches' if count == 1 else 'masks match'} no test image and "
            f"{'is' if count == 1 else 'are'} not used: {', '.join(map(str, test_set.unused_masks))} (the "
            "mask of <test>/<defect>/<name>.png is <ground truth>/<defect>/<name>_mask.png)"
        )
    validation = validation_set(args.validation) if args.validation is not None else None
    # before fitting: the held-out images are no part of the fit
    fit, held_out = split_normal(args.normal, args.holdout if validation is None else 0, args.seed)
    reading = Reading(args.device, args.batch_size, args.max_image_pixels, args.checkpoint_format)
    method = _method(args, fit, saved, reading)
    for message in method.messages:
        print(message)
    result = method.score(test_set, args.top_k, reading)
    if saved is not None and validation is None:  # the scorer's own decision
        decision = Decision.from_json(saved.record["decision"]) if saved.record["decision"] else None
    else:
        decision = choose_decision(
            method, args.top_k, reading, args.threshold_quantile, held_out, args.normal, validation
        )
        _print_decision(decision)
    if decision is not None and result.metrics is not None:
        labels = torch.tensor([i.label for i in test_set.images])
        result.metrics.update(decision_metrics(decision, result.scores, labels, result.maps, result.truth))

    claim_folder(args.out, COMMAND)
    if args.figures != "none":
        every = args.figures == "all"
        write_figures(
            args.out, every, test_set, result, method.size, method.norm, decision, args.max_image_pixels
        )
    text = scores_csv(test_set, result, decision)
    atomic_write(args.out / "scores.csv", lambda tmp: tmp.write_text(text))
    if decision is not None:
        flagged = int(decision.anomalous(result.scores).sum())
        print(f"anomalous: {flagged} of {len(test_set.images)} test images (scores.csv: is_anomalous)")
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
    if args.save_scorer:
        method.scorer.record["decision"] = decision.to_json() if decision is not None else None
        save_scorer(args.save_scorer, method.scorer.tensors, method.scorer.record)
        print(f"wrote the scorer to {args.save_scorer} (apply it with --scorer {args.save_scorer})")
    print(f"wrote {args.out}")
    return result


def _method(args: Namespace, fit: list[Path], saved: SavedScorer | None, reading: Reading) -> Method:
    """--method's ``Method``, fitted on the ``fit`` normal images or read from the ``saved`` scorer."""
    common = {"fit": fit, "normal": args.normal, "reading": reading, "img_size": args.img_size}
    common.update(mean=args.mean, std=args.std, saved=saved, scorer=args.scorer)
    settings = {flag: getattr(args, flag) for flag in FIXED[args.method]}
    if args.method == MAE:
        return mae_method(args.checkpoint, settings=settings, **common)
    if args.method == PIXEL_KNN:
        return pixel_knn_method(settings=settings, **common)
    return features_method(args.checkpoint, settings=settings, **common)


def _print_decision(decision: Decision | None) -> None:
    if decision is None:
        print(
            "note: no decision (is_anomalous left empty): give --normal with --holdout above 0, or "
            "--validation, to choose a threshold"
        )
        return
    print(
        f"threshold ({decision.chosen_by}, {decision.images} images of {decision.source}): image score "
        f">= {decision.image_threshold:.6g} is anomalous, heat-map value >= {decision.pixel_threshold:.6g} "
        "a defect pixel"
    )


def _print_metrics(metrics: dict) -> None:
    counts = ", ".join(f"{kind} {n}" for kind, n in metrics["images"].items())
    print(f"test images: {counts}")
    for name in ("image_auroc", "pixel_auroc", "aupro"):
        if name in metrics:
            print(f"{name}: {metrics[name]:.4f}")
    for kind, value in metrics.get("image_auroc_per_kind", {}).items():
        print(f"image_auroc {GOOD} vs {kind}: {value:.4f}")
    for level in ("image", "pixel"):
        if f"{level}_f1" in metrics:
            scores = ", ".join(
                f"{name} {metrics[f'{level}_{name}']:.4f}" for name in ("f1", "precision", "recall")
            )
            print(f"{level} level at the threshold: {scores}")
    reasons: dict[str, list[str]] = {}  # the metrics that share a reason, on one line
    for name, reason in metrics.get("not_computed", {}).items():
        reasons.setdefault(reason, []).append(name)
    for reason, names in reasons.items():
        print(f"note: {', '.join(names)} not computed: {reason}")


def main(argv: list[str] | None = None) -> AnomalyResult:
    return parse_and_run(build_parser(), run, argv)
