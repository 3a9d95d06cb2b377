"""``mae anomaly`` end to end (``mae.apps.anomaly.detection``, ``mae.cli.anomaly``) on tiny MVTec-layout
trees: scores, maps and metrics, an unlabelled folder with raw errors, every bad input named with its fix,
empty and unused masks, identical normal images, and the pixel-kNN method without a checkpoint."""

import csv
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.metrics import roc_auc_score

from mae.apps.anomaly import (
    image_scores,
)
from mae.apps.anomaly.baseline import nearest_normal_errors
from mae.apps.anomaly.evaluation import score_test_set
from mae.apps.anomaly.layout import read_test_set
from mae.cli.main import invoke
from tests.helpers import run_mae
from tests.unit.apps.anomaly.trees import (
    DEFECT,
    SIZE,
    normalised,
    save,
    smooth_images,
    write_tree,
)


def test_anomaly_command__scores_maps_and_metrics_on_an_mvtec_tree(smooth_checkpoint, tmp_path, capsys):
    tree = write_tree(tmp_path / "part")
    out = tmp_path / "out"
    result = invoke(
        "anomaly",
        [
            "--checkpoint",
            str(smooth_checkpoint),
            "--normal",
            str(tree / "train" / "good"),
            "--test",
            str(tree / "test"),
            "--out",
            str(out),
            "--top-k",
            "2",
        ],
    )
    printed = capsys.readouterr().out
    assert "4 complementary masks at ratio 0.75: every patch hidden 3 times" in printed
    with open(out / "scores.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["path"] for r in rows] == [f"good/{i:03d}.png" for i in range(3)] + [
        f"checker/{i:03d}.png" for i in range(3)
    ]
    labels, scores = [int(r["label"]) for r in rows], [float(r["score"]) for r in rows]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["image_auroc"] == pytest.approx(roc_auc_score(labels, scores), abs=1e-6) == 1.0
    assert metrics["images"] == {"good": 3, "checker": 3} and metrics["settings"]["hidden_per_patch"] == 3
    assert metrics["decision"]["chosen_by"] == "normal-quantile" and "image_f1" in metrics  # the decision
    assert {r["is_anomalous"] for r in rows} <= {"0", "1"}
    truth = np.zeros((6, SIZE, SIZE), bool)
    truth[3:, DEFECT[0], DEFECT[1]] = True
    assert metrics["pixel_auroc"] == pytest.approx(
        roc_auc_score(truth.ravel(), result.maps.numpy().ravel()), 1e-6
    )
    assert metrics["pixel_auroc"] > 0.8 and 0 < metrics["aupro"] <= 1
    inside = result.maps[3:, DEFECT[0], DEFECT[1]].mean()
    assert inside > 2 * result.maps[3:].mean()  # the map is bright where the defect is, not elsewhere
    for name in ("good/000.png", "checker/002.png"):
        assert Image.open(out / "heatmaps" / name).width > 4 * SIZE
    assert Image.open(out / "overview.png").height > Image.open(out / "heatmaps" / "good/000.png").height
    # without ground truth: image AUROC only
    (tree / "ground_truth").rename(tmp_path / "elsewhere")
    invoke(
        "anomaly",
        [
            "--checkpoint",
            str(smooth_checkpoint),
            "--normal",
            str(tree / "train" / "good"),
            "--test",
            str(tree / "test"),
            "--out",
            str(tmp_path / "out2"),
            "--figures",
            "none",
        ],
    )
    metrics = json.loads((tmp_path / "out2" / "metrics.json").read_text())
    assert "image_auroc" in metrics and "pixel_auroc" not in metrics and "aupro" not in metrics
    with pytest.raises(FileNotFoundError, match="ground-truth folder .*nowhere does not exist"):
        invoke(
            "anomaly",
            [
                "--checkpoint",
                str(smooth_checkpoint),
                "--normal",
                str(tree / "train" / "good"),
                "--test",
                str(tree / "test"),
                "--out",
                str(out),
                "--ground-truth",
                str(tmp_path / "nowhere"),
            ],
        )


def test_anomaly_command__unlabelled_folder_raw_errors_no_figures(smooth_checkpoint, tmp_path, capsys):
    folder = tmp_path / "plain"
    for i, pixels in enumerate(smooth_images(3, seed=4)):
        save(pixels, folder / f"{i}.png")
    out = tmp_path / "out"
    result = invoke(
        "anomaly",
        [
            "--checkpoint",
            str(smooth_checkpoint),
            "--test",
            str(folder),
            "--out",
            str(out),
            "--raw-errors",
            "--figures",
            "none",
        ],
    )
    assert result.metrics is None and not (out / "metrics.json").exists() and not (out / "heatmaps").exists()
    rows = (out / "scores.csv").read_text().splitlines()
    assert rows[0] == "path,kind,label,score,is_anomalous" and [r.split(",")[0] for r in rows[1:]] == [
        "0.png",
        "1.png",
        "2.png",
    ]
    assert "normal images" not in capsys.readouterr().out  # raw errors: no normal image scored
    save(smooth_images(1, seed=5)[0], tmp_path / "normal" / "a.png")
    with pytest.raises(ValueError, match="holds 1 image: per-patch statistics need at least 2 normal images"):
        invoke(
            "anomaly",
            [
                "--checkpoint",
                str(smooth_checkpoint),
                "--normal",
                str(tmp_path / "normal"),
                "--holdout",
                "0",
                "--test",
                str(folder),
                "--out",
                str(out),
            ],
        )
    with pytest.raises(SystemExit):  # neither --normal nor --raw-errors: a usage error
        invoke("anomaly", ["--checkpoint", str(smooth_checkpoint), "--test", str(folder), "--out", str(out)])
    assert "give --normal, a folder of defect-free images" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("method", ["mae", "features"])
def test_anomaly_command__bad_input_named_with_the_fix(smooth_checkpoint, tmp_path, method):
    tree = write_tree(tmp_path / "part")
    out = str(tmp_path / "out")

    def command(normal=tree / "train" / "good", test=tree / "test", *extra):
        return [
            "--method",
            method,
            "--checkpoint",
            str(smooth_checkpoint),
            "--normal",
            str(normal),
            "--test",
            str(test),
            "--out",
            out,
            *extra,
        ]

    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty holds no image file"):
        invoke("anomaly", command(normal=tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        invoke("anomaly", command(test=tmp_path / "nowhere"))
    # a mask of another size than its image
    save(np.zeros((SIZE + 2, SIZE), np.uint8), tree / "ground_truth" / "checker" / "001_mask.png")
    with pytest.raises(
        ValueError, match=r"001_mask.png is 16x18 but its image .*001.png is 16x16.*write it at 16x16"
    ):
        invoke("anomaly", command())
    (tree / "ground_truth" / "checker" / "001_mask.png").unlink()
    with pytest.raises(
        ValueError, match=r"checker/001.png has no ground-truth mask: expected .*001_mask.png"
    ):
        invoke("anomaly", command())
    # an unreadable image
    save(np.zeros((SIZE, SIZE), np.uint8), tree / "ground_truth" / "checker" / "001_mask.png")
    (tree / "test" / "checker" / "002.png").write_bytes(b"not a png")
    with pytest.raises(
        ValueError, match=r"cannot read .*checker/002.png.*remove the file from its folder or replace"
    ):
        invoke("anomaly", command())
    (tree / "test" / "checker").rename(tree / "test" / "checker_empty")
    for f in (tree / "test" / "checker_empty").iterdir():
        f.unlink()
    with pytest.raises(ValueError, match="class folder .*checker_empty holds no image file"):
        invoke("anomaly", command())
    with pytest.raises(SystemExit):  # a usage error, as argparse reports one
        invoke("anomaly", command(tree / "train" / "good", tree / "test", "--mask-ratio", "1"))
    # a test folder without good, through the real command line: the message alone, exit status 2
    (tree / "test" / "good").rename(tree / "test" / "ok")
    result = run_mae("anomaly", *command(), check=False)
    assert result.returncode == 2
    assert "has class folders ['checker_empty', 'ok'] but no 'good'" in result.stderr
    assert "Traceback" not in result.stderr


def test_anomaly_command__empty_masks_keep_the_scores_and_unused_masks_are_named(tiny_checkpoint, tmp_path):
    tree = write_tree(tmp_path / "part")
    gt = tree / "ground_truth"
    for mask in (gt / "checker").iterdir():
        save(np.zeros((SIZE, SIZE), np.uint8), mask)  # every mask empty: no pixel metric can be computed
    orphans = [gt / "checker" / "007_mask.png", gt / "scratch" / "000_mask.png"]  # their images are gone
    for orphan in orphans:
        save(np.zeros((SIZE, SIZE), np.uint8), orphan)
    out = tmp_path / "out"
    result = run_mae(
        "anomaly",
        "--checkpoint",
        str(tiny_checkpoint),
        "--normal",
        str(tree / "train" / "good"),
        "--test",
        str(tree / "test"),
        "--out",
        str(out),
        "--figures",
        "none",
    )
    assert (
        f"note: 2 ground-truth masks match no test image and are not used: {orphans[0]}, {orphans[1]}"
        in result.stdout
    )
    assert len((out / "scores.csv").read_text().splitlines()) == 1 + 6  # the scoring is kept
    metrics = json.loads((out / "metrics.json").read_text())
    assert "image_auroc" in metrics and "pixel_auroc" not in metrics and "aupro" not in metrics
    assert metrics["unused_masks"] == [str(p) for p in orphans]
    reason = metrics["not_computed"]["aupro"]
    assert metrics["not_computed"]["pixel_auroc"] == reason
    assert f"no defect pixel in the ground truth ({gt}" in reason
    assert f"note: pixel_auroc, aupro not computed: {reason}" in result.stdout


def test_anomaly_command__identical_normal_images_refused_and_non_finite_scores_named(
    tiny_checkpoint, tmp_path
):
    tree = write_tree(tmp_path / "part")
    copies = tmp_path / "copies"
    copies.mkdir()
    for i in range(3):
        shutil.copy(tree / "train" / "good" / "000.png", copies / f"{i}.png")
    result = run_mae(
        "anomaly",
        "--checkpoint",
        str(tiny_checkpoint),
        "--normal",
        str(copies),
        "--holdout",
        "0",
        "--test",
        str(tree / "test"),
        "--out",
        str(tmp_path / "out"),
        check=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: --normal {copies}: " in result.stderr
    assert "standard deviation 0 at every patch position" in result.stderr
    assert "add varied defect-free images, or pass --raw-errors" in result.stderr
    assert not (tmp_path / "out").exists()
    # a score that is not a finite number never reaches the AUROC
    errors = torch.rand(6, 16)
    errors[4, 3] = float("nan")
    with pytest.raises(
        ValueError, match=r"1 of 6 test images have errors that are not finite .*checker/001.png"
    ):
        score_test_set(errors, read_test_set(tree / "test"), (4, 4), (SIZE, SIZE), top_k=2)


def test_anomaly_command__pixel_knn_method_needs_no_checkpoint(tmp_path):
    tree = write_tree(tmp_path / "part")
    out = tmp_path / "out"
    common = ["--normal", str(tree / "train" / "good"), "--test", str(tree / "test")]
    result = run_mae(
        "anomaly",
        "--method",
        "pixel-knn",
        *common,
        "--out",
        str(out),
        "--img-size",
        str(SIZE),
        "--patch-size",
        "4",
        "--top-k",
        "2",
        "--holdout",
        "0",  # every normal image a reference, as computed below
    )
    with open(out / "scores.csv") as f:
        rows = list(csv.DictReader(f))

    # independently: each test image's per-patch difference to its nearest normal image
    # (``nearest_normal_errors`` is checked patch by patch above), the images normalised as a 3-channel input
    # without statistics is
    def pixels(paths):
        return normalised(np.stack([np.asarray(Image.open(p)) for p in paths]))

    normal = pixels(sorted((tree / "train" / "good").iterdir()))
    test = pixels([tree / "test" / r["path"] for r in rows])
    expected = image_scores(nearest_normal_errors(test, normal, patch_size=4), top_k=2)
    assert [float(r["score"]) for r in rows] == pytest.approx(expected.tolist(), rel=1e-4)
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"image_auroc", "image_auroc_per_kind", "pixel_auroc", "aupro", "images"} <= set(metrics)
    assert metrics["settings"]["method"] == "pixel-knn" and metrics["settings"]["patch_size"] == 4
    assert (out / "overview.png").is_file() and (out / "heatmaps" / "checker" / "000.png").is_file()
    assert "normal images: 8" in result.stdout
    # what each method needs, named
    for args, message in (
        (["--method", "pixel-knn", *common], "--method pixel-knn needs --img-size"),
        (
            ["--method", "pixel-knn", "--test", str(tree / "test"), "--img-size", "16"],
            "--method pixel-knn needs --normal",
        ),
        (common, "--method mae needs --checkpoint"),
    ):
        result = run_mae("anomaly", *args, "--out", str(tmp_path / "out2"), check=False)
        assert result.returncode == 2 and message in result.stderr, result.stderr
