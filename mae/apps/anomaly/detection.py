"""One run of ``mae anomaly``, end to end (``detect``): its outputs checked before any work, the test
folder read, the scorer fitted on the normal images or read from a saved one, the test images scored, the
decision chosen (``decision``), and ``scores.csv``, the figures, ``metrics.json`` and the saved scorer
written (``outputs``, ``saved_scorer``)."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mae.apps.anomaly.decision import (
    DEFAULT_HOLDOUT,
    check_decision_options,
    choose_decision,
    split_normal,
    validation_set,
)
from mae.apps.anomaly.decision import OPTIONS as DECISION_OPTIONS
from mae.apps.anomaly.evaluation import AnomalyResult
from mae.apps.anomaly.layout import TestSet, read_test_set
from mae.apps.anomaly.outputs import scores_csv, write_figures
from mae.apps.anomaly.report import print_decision, print_metrics, print_unused_masks
from mae.apps.anomaly.saved_scorer import scorer_output
from mae.apps.anomaly.scorers import SCORERS
from mae.apps.anomaly.scorers.base import ModelInputs, NormalImages, Option, Reading, Scorer
from mae.apps.anomaly.scorers.choice import ScorerChoice
from mae.apps.anomaly.threshold import DEFAULT_QUANTILE, Decision, decision_metrics
from mae.io.atomic import atomic_write
from mae.io.outputs import Output, check_outputs, claim_folder

COMMAND = "mae.anomaly"
FIGURES = ("all", "overview", "none")  # a figure per test image and overview.png, the overview, none
METHODS = "; ".join(f"{name}: {scorer.summary}" for name, scorer in SCORERS.items())
OPTIONS = [  # the command's own flags, besides the shared ones (mae.cli.command_options) and the scorers'
    Option("method", str, f"{METHODS}; with --scorer: the scorer's", choices=tuple(SCORERS)),
    Option(
        "normal",
        Path,
        "defect-free images (e.g. <category>/train/good) a scorer is fitted on: mae's errors are "
        "standardised by theirs (unless --raw-errors), pixel-knn compares with them, features keeps their "
        "patch features",
    ),
    Option(
        "test",
        Path,
        "test images: <category>/test with good/ and one folder per defect, or a folder of images (no "
        "labels, no metrics)",
        required=True,
    ),
    Option("ground_truth", Path, "masks <defect>/<name>_mask.png (default: <test>/../ground_truth if there)"),
    Option("top_k", int, "image score: mean of the k highest patches (default 4; features: 1, the highest)"),
    Option(
        "seed",
        int,
        "draws everything random (default 0; with --scorer, the scorer's): mae's masks, the --holdout "
        "images and, for features, the coreset's random projection and its first pick",
    ),
    Option(
        "figures",
        str,
        "a heat-map figure per test image and overview.png (all), the overview, none",
        default="all",
        choices=FIGURES,
    ),
    *DECISION_OPTIONS,
    Option(
        "save_scorer",
        Path,
        "write the fitted scorer to this folder, as safetensors + JSON, to apply later with --scorer: its "
        "tensors (the feature bank, the normal error statistics or the normal images), the settings, "
        "preprocessing, model identity and threshold",
    ),
    Option(
        "scorer",
        Path,
        "a folder --save-scorer wrote: score --test with it, no --normal (mae, features: the model is its "
        "recorded checkpoint, or --checkpoint with the same weights)",
    ),
]


@dataclass(frozen=True)
class AnomalyRun:
    """What a run was asked: the ``choice`` of scorer, the ``test`` folder (and its ``ground_truth``), the
    ``out`` folder, the ``normal`` images (to fit on and hold out ``holdout`` of), a ``validation`` folder,
    where to ``save_scorer``, which ``figures``, the ``threshold_quantile``, the model ``inputs`` and how
    files are read (``reading``).

    Raises:
        UsageError: a holdout or quantile outside its range; what the scorer needs missing, or what it
            cannot use given (``ScorerChoice.check``).
    """

    choice: ScorerChoice
    test: Path
    out: Path
    normal: Path | None = None
    ground_truth: Path | None = None
    validation: Path | None = None
    save_scorer: Path | None = None
    figures: str = "all"
    holdout: float = DEFAULT_HOLDOUT
    threshold_quantile: float = DEFAULT_QUANTILE
    inputs: ModelInputs = field(default_factory=ModelInputs)
    reading: Reading = field(default_factory=Reading)

    def __post_init__(self) -> None:
        check_decision_options(self.holdout, self.threshold_quantile)
        self.choice.check(self.inputs, self.normal)


def detect(run: AnomalyRun) -> AnomalyResult:
    """Score the test images and write ``scores.csv``, the figures and (labelled tests) ``metrics.json``;
    decide which are anomalous at a threshold chosen on held-out normal images or on the validation folder
    (or the saved scorer's own).

    Raises:
        OutputError: an output folder that is not this command's, or one inside an input.
        ConfigError: the normal images identical (no spread to standardise by); too few to hold some out
            and fit on the rest; a model with other weights than the saved scorer's.
        InputError: a test or validation folder in no layout the command reads.
    """
    _check_outputs(run)
    test_set = read_test_set(run.test, run.ground_truth)  # the folders first: no model loaded in vain
    print_unused_masks(test_set.unused_masks)
    validation = validation_set(run.validation) if run.validation is not None else None
    # before fitting: the held-out images are no part of the fit
    holdout = run.holdout if validation is None else 0
    fit, held_out = split_normal(run.normal, holdout, run.choice.settings.seed)
    scorer = _scorer(run, fit)
    for message in scorer.messages:
        print(message)
    result = scorer.score(test_set, run.reading)
    if scorer.applied is not None and validation is None:  # the scorer's own decision
        decision = scorer.own_decision()
    else:
        decision = choose_decision(
            scorer, run.reading, run.threshold_quantile, held_out, run.normal, validation
        )
        print_decision(decision)
    if decision is not None and result.metrics is not None:
        labels = torch.tensor([i.label for i in test_set.images])
        result.metrics.update(decision_metrics(decision, result.scores, labels, result.maps, result.truth))
    _write(run, test_set, scorer, result, decision)
    return result


def _check_outputs(run: AnomalyRun) -> None:
    """Refuse, before any work, an output that is not ours or lies inside an input."""
    inputs = [run.test, run.test.parent / "ground_truth", run.inputs.checkpoint, run.normal, run.ground_truth]
    inputs += [run.validation, run.validation.parent / "ground_truth"] if run.validation else []
    inputs += [run.choice.folder]
    outputs = [Output(run.out, "--out", kind="folder")]
    outputs += [scorer_output(run.save_scorer)] if run.save_scorer else []
    check_outputs(COMMAND, outputs, [p for p in inputs if p is not None])


def _scorer(run: AnomalyRun, fit: list[Path]) -> Scorer:
    """The scorer fitted on the ``fit`` normal images, or read from the saved one."""
    choice = run.choice
    if choice.saved is None:
        return choice.scorer.fit(choice.settings, run.inputs, NormalImages(run.normal, fit), run.reading)
    return choice.scorer.load(choice.saved, choice.folder, run.inputs, run.reading)


def _write(
    run: AnomalyRun, test_set: TestSet, scorer: Scorer, result: AnomalyResult, decision: Decision | None
) -> None:
    """The output folder's files, the saved scorer, and what the command prints of them."""
    claim_folder(run.out, COMMAND)
    if run.figures != "none":
        write_figures(
            run.out,
            run.figures == "all",
            test_set,
            result,
            scorer.size,
            scorer.norm,
            decision,
            run.reading.max_pixels,
        )
    text = scores_csv(test_set, result, decision)
    atomic_write(run.out / "scores.csv", lambda tmp: tmp.write_text(text))
    if decision is not None:
        flagged = int(decision.anomalous(result.scores).sum())
        print(f"anomalous: {flagged} of {len(test_set.images)} test images (scores.csv: is_anomalous)")
    if result.metrics is not None:
        settings = {
            "method": scorer.name,
            "normal": None if run.normal is None else str(run.normal),
            "test": str(run.test),
            "top_k": scorer.settings.top_k,
            **scorer.recorded,
            "metric_size": list(scorer.size),
        }
        record = {**result.metrics, "settings": settings}
        atomic_write(
            run.out / "metrics.json", lambda tmp: tmp.write_text(json.dumps(record, indent=2) + "\n")
        )
        print_metrics(result.metrics)
    if run.save_scorer:
        scorer.save(run.save_scorer, decision)
        print(f"wrote the scorer to {run.save_scorer} (apply it with --scorer {run.save_scorer})")
    print(f"wrote {run.out}")
