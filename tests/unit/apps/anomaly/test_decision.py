"""Where ``mae anomaly``'s decision comes from (``mae.apps.anomaly.decision``), through the command: the
held-out normal images' threshold flags images and writes predicted masks (in a tree of their own), a
validation folder's F1-maximising threshold, and the decision's settings and folders refused at start."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sklearn.metrics import precision_recall_fscore_support

from tests.helpers import run_mae
from tests.unit.apps.anomaly.trees import brute_force_f1_max, save
from tests.unit.apps.anomaly.trees import rows as read_rows

KNN = ("anomaly", "--method", "pixel-knn", "--img-size", "32", "--patch-size", "8")


def printed_threshold(stdout: str) -> float:
    return float(stdout.split("image score > ")[1].split()[0])


@pytest.mark.slow
def test_anomaly_command__holdout_threshold_flags_images_and_writes_predicted_masks(digits, tmp_path):
    task, out = digits / "task", tmp_path / "out"
    normal = ("--normal", str(task / "train" / "good"))
    result = run_mae(
        *KNN, *normal, "--test", str(task / "test"), "--out", str(out), "--threshold-quantile", "0.5"
    )
    assert "normal images: 9 " in result.stdout  # 3 of 12 (--holdout 0.2, rounded up) held out of the fit
    metrics = json.loads((out / "metrics.json").read_text())
    decision = metrics["decision"]
    assert (
        decision["chosen_by"] == "normal-quantile" and decision["quantile"] == 0.5 and decision["images"] == 3
    )
    rows = read_rows(out / "scores.csv")
    flags = np.array([int(r["is_anomalous"]) for r in rows])
    scores, labels = np.array([float(r["score"]) for r in rows]), np.array([int(r["label"]) for r in rows])
    assert 0 < flags.sum() < len(rows)  # at the median of the held-out scores, some are flagged, not all
    clear = np.abs(scores - decision["image_threshold"]) > 1e-5 * abs(decision["image_threshold"])
    assert (flags == (scores > decision["image_threshold"]))[clear].all()
    precision, recall, f1, _ = precision_recall_fscore_support(
        labels, flags, average="binary", zero_division=0
    )
    assert (metrics["image_precision"], metrics["image_recall"], metrics["image_f1"]) == pytest.approx(
        (precision, recall, f1)
    )
    # the predicted masks, 0 / 255 at the heat map's size, against the ground truth (written at 32 px)
    predicted, truth = [], []
    for r in rows:
        mask = np.asarray(Image.open(out / "predicted_masks" / r["path"]))
        assert mask.shape == (32, 32) and set(np.unique(mask)) <= {0, 255}
        predicted.append(mask > 0)
        gt = task / "ground_truth" / r["path"].replace(".png", "_mask.png")
        truth.append(np.asarray(Image.open(gt)) > 0 if r["kind"] != "good" else np.zeros((32, 32), bool))
    predicted, truth = np.stack(predicted), np.stack(truth)
    assert predicted.any()
    assert metrics["pixel_confusion"] == {
        "true_positive": int((predicted & truth).sum()),
        "false_positive": int((predicted & ~truth).sum()),
        "false_negative": int((~predicted & truth).sum()),
        "true_negative": int((~predicted & ~truth).sum()),
    }
    assert "image level at the threshold: f1" in result.stdout
    # the normal images themselves as an unlabelled test folder: the 9 fitted score 0 (each is its own
    # nearest), the 3 held out were not fitted and score above; at quantile 1 the threshold is their maximum
    result = run_mae(
        *KNN,
        *normal,
        "--test",
        str(task / "train" / "good"),
        "--out",
        str(tmp_path / "again"),
        "--threshold-quantile",
        "1",
        "--figures",
        "none",
    )
    rows = read_rows(tmp_path / "again" / "scores.csv")
    scores = np.array([float(r["score"]) for r in rows])
    assert (scores == 0).sum() == 9 and printed_threshold(result.stdout) == pytest.approx(scores.max(), 1e-5)
    assert all(r["is_anomalous"] == "0" for r in rows if float(r["score"]) == 0)


@pytest.mark.slow
def test_anomaly_command__predicted_masks_in_a_tree_of_their_own_whatever_the_names(digits, tmp_path):
    task, test, out = digits / "task", tmp_path / "test", tmp_path / "out"
    test.mkdir()
    normal_image = sorted((task / "train" / "good").iterdir())[0]
    (test / "a.png").write_bytes(normal_image.read_bytes())  # a fitted normal image: scores 0 everywhere
    defective = sorted((task / "test" / "blob").iterdir())[0]
    (test / "a_predicted_mask.png").write_bytes(defective.read_bytes())  # once the name of a.png's mask
    validation = ("--validation", str(digits / "val" / "test"))  # nothing held out: every image fitted
    run_mae(
        *KNN, "--normal", str(task / "train" / "good"), *validation, "--test", str(test), "--out", str(out)
    )
    names = ["a.png", "a_predicted_mask.png"]
    assert sorted(p.name for p in (out / "heatmaps").iterdir()) == names
    assert sorted(p.name for p in (out / "predicted_masks").iterdir()) == names
    for name in names:
        assert Image.open(out / "heatmaps" / name).mode == "RGB"  # the figure
        mask = np.asarray(Image.open(out / "predicted_masks" / name))
        assert mask.shape == (32, 32) and set(np.unique(mask)) <= {0, 255}
    assert not np.asarray(Image.open(out / "predicted_masks" / "a.png")).any()


@pytest.mark.slow
def test_anomaly_command__validation_threshold_maximises_f1_on_it(digits, tmp_path):
    task, val = digits / "task", digits / "val" / "test"
    normal = ("--normal", str(task / "train" / "good"))
    result = run_mae(
        *KNN,
        *normal,
        "--test",
        str(task / "test"),
        "--out",
        str(tmp_path / "out"),
        "--validation",
        str(val),
        "--figures",
        "none",
    )
    assert "normal images: 12 " in result.stdout  # with a validation set nothing is held out
    decision = json.loads((tmp_path / "out" / "metrics.json").read_text())["decision"]
    assert decision["chosen_by"] == "validation-f1" and decision["images"] == 8
    assert decision["source"] == str(val) and decision["quantile"] is None  # its masks chose the pixels'
    # the validation images scored as a test set by the same fit: the brute-force F1-maximising score
    run_mae(
        *KNN,
        *normal,
        "--test",
        str(val),
        "--out",
        str(tmp_path / "val"),
        "--holdout",
        "0",
        "--figures",
        "none",
    )
    rows = read_rows(tmp_path / "val" / "scores.csv")
    assert all(r["is_anomalous"] == "" for r in rows)  # --holdout 0, no validation: no decision
    scores, labels = np.array([float(r["score"]) for r in rows]), np.array([r["label"] == "1" for r in rows])
    assert decision["image_threshold"] == pytest.approx(brute_force_f1_max(scores, labels)[0], 1e-5)


@pytest.mark.slow
def test_anomaly_command__decision_settings_and_folders_refused_at_start(digits, tmp_path):
    task, out = digits / "task", tmp_path / "out"
    few = tmp_path / "few"
    few.mkdir()
    for path in sorted((task / "train" / "good").iterdir())[:3]:
        (few / path.name).write_bytes(path.read_bytes())
    only_good = tmp_path / "only_good"
    (only_good / "good").mkdir(parents=True)
    (only_good / "good" / "0.png").write_bytes(next((task / "test" / "good").iterdir()).read_bytes())
    common = ("--normal", str(task / "train" / "good"), "--test", str(task / "test"), "--out", str(out))
    for args, message in (
        (
            ("--normal", str(few), "--test", str(task / "test"), "--out", str(out)),
            f"--normal {few} holds 3 images: --holdout 0.2 holds out 2 (at least 2) for the threshold and "
            "leaves 1 to fit on",
        ),
        ((*common, "--threshold-quantile", "1.5"), "--threshold-quantile must be in [0, 1]"),
        ((*common, "--holdout", "1"), "--holdout must be in [0, 1)"),
        ((*common, "--validation", str(only_good)), f"--validation {only_good} needs good and defective"),
        ((*common, "--validation", str(few)), "it has images without class folders"),
    ):
        result = run_mae(*KNN, *args, check=False)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, (
            result.stderr
        )
        assert not out.exists()


def copies_task(task: Path, root: Path, normals: list[np.ndarray], copies: int) -> tuple[Path, Path]:
    """(--normal, --test) under ``root``: ``copies`` PNG copies of each of the ``normals`` (H, W) uint8
    images; a test folder of one copy of each in good/ and the defects of ``task`` (with their masks)."""
    normal, test = root / "normal", root / "part" / "test"
    for i, pixels in enumerate(normals):
        for c in range(copies):
            save(pixels, normal / f"{i}_{c}.png")
        save(pixels, test / "good" / f"{i}.png")
    for kind in ("blob", "scratch"):
        shutil.copytree(task / "test" / kind, test / kind)
        shutil.copytree(task / "ground_truth" / kind, root / "part" / "ground_truth" / kind)
    return normal, test


def flags(out: Path) -> dict[str, str]:
    return {r["path"]: r["is_anomalous"] for r in read_rows(out / "scores.csv")}


@pytest.mark.slow
@pytest.mark.parametrize(
    "method",
    [("--method", "pixel-knn"), ("--method", "features"), ("--method", "mae", "--raw-errors")],
    ids=lambda m: " ".join(m[1:]),
)
def test_anomaly_command__normal_images_with_no_spread_flag_no_copy_of_them(task, tmp_path, method):
    """Every --normal image the same file: each held-out image scores what every normal image scores, the
    threshold is that score, and an exact copy of the image is normal (score > threshold is anomalous).
    (Its pixels: at the pixel quantile 0.99 about 1 % of a normal image's pixels are above; pixel-knn's
    maps of a copy are 0 everywhere, so none.)"""
    checkpoint, digits = task
    image = np.asarray(Image.open(sorted((digits / "train" / "good").iterdir())[0]))
    normal, test = copies_task(digits, tmp_path, [image], copies=6)
    model = (
        ("--img-size", "16", "--patch-size", "4")
        if method[1] == "pixel-knn"
        else ("--checkpoint", str(checkpoint))
    )
    out = tmp_path / "out"
    result = run_mae(
        "anomaly",
        *method,
        *model,
        "--normal",
        str(normal),
        "--test",
        str(test),
        "--out",
        str(out),
        "--batch-size",  # each image computed alone: a copy's score is its original's to the last bit
        "1",
    )
    assert f"note: the 2 held-out normal images of {normal} all score " in result.stdout
    assert flags(out)["good/0.png"] == "0", result.stdout
    decision = json.loads((out / "metrics.json").read_text())["decision"]
    score = next(float(r["score"]) for r in read_rows(out / "scores.csv") if r["path"] == "good/0.png")
    assert decision["image_threshold"] == pytest.approx(score, abs=1e-5)
    if method[1] == "pixel-knn":  # the nearest normal image is the copy itself: 0, and every defect above
        assert score == 0 and not np.asarray(Image.open(out / "predicted_masks" / "good" / "0.png")).any()
        assert all(flag == "1" for path, flag in flags(out).items() if not path.startswith("good/"))


@pytest.mark.slow
def test_anomaly_command__few_distinct_or_near_identical_normal_images_flag_no_copy_of_them(task, tmp_path):
    """pixel-knn compares with the one nearest normal image (k = 1): two images copied three times each
    leave every held-out image a copy among those fitted (all score 0); near-identical images (one grey
    level of noise) score their tiny distance. At --threshold-quantile 1 no copy of any normal image is
    flagged, the held-out images' own copies included."""
    _, digits = task
    images = [np.asarray(Image.open(p)) for p in sorted((digits / "train" / "good").iterdir())[:2]]
    rng = np.random.default_rng(0)
    noisy = []
    for _ in range(6):
        pixels = images[0].astype(int)
        pixels[tuple(rng.integers(0, images[0].shape[0], (2, 3)))] += 1
        noisy.append(pixels.clip(0, 255).astype(np.uint8))
    for name, normals, copies in (("few", images, 3), ("near", noisy, 1)):
        normal, test = copies_task(digits, tmp_path / name, normals, copies)
        out = tmp_path / name / "out"
        result = run_mae(
            *KNN[:3],
            "--img-size",
            "16",
            "--patch-size",
            "4",
            "--normal",
            str(normal),
            "--test",
            str(test),
            "--out",
            str(out),
            "--figures",
            "none",
            "--threshold-quantile",
            "1",
        )
        copies_flagged = {p: f for p, f in flags(out).items() if p.startswith("good/")}
        assert set(copies_flagged.values()) == {"0"}, (name, copies_flagged, result.stdout)
        assert "1" in flags(out).values()  # the defects still are
