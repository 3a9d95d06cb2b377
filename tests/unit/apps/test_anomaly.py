"""Anomaly maps from reconstruction error (``mae.apps.anomaly``, ``mae anomaly``): complementary
masks, the per-patch error against an independent computation, a planted defect lit up by a trained tiny
MAE, the metrics against scikit-learn and the definition of AUPRO, the command line end to end on a tiny
MVTec-layout tree, its bad-input errors, the built-in digit task and the benchmark at tiny size."""

import csv
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import ndimage
from sklearn.metrics import roc_auc_score

from mae.apps.anomaly import (
    NormalStatistics,
    aupro,
    complementary_masks,
    image_auroc,
    image_scores,
    pixel_auroc,
    reconstruction_errors,
)
from mae.apps.anomaly.baseline import nearest_normal_errors
from mae.apps.anomaly.digits import CHANGED, DEFECTS, write_digit_anomalies
from mae.apps.anomaly.evaluation import score_test_set
from mae.apps.anomaly.layout import read_test_set
from mae.cli.main import invoke
from mae.data.views.normalize import IMAGENET_MEAN, IMAGENET_STD
from mae.models import create_model
from mae.models.masking import random_masking
from tests.helpers import (
    REPO,
    TINY_KWARGS,
    RandomImages,
    make_trainer,
    pretrain_module,
    run_mae,
    tiny_pretraining_checkpoint,
)

SIZE = 16  # the fixture model's input: a 4 x 4 grid of 4 x 4 patches
DEFECT = (slice(1, 6), slice(9, 14))  # rows, columns of the planted defect: patches (0..1, 2..3)


def smooth_images(count: int, seed: int) -> np.ndarray:
    """(count, SIZE, SIZE, 3) uint8: a random colour with a gentle random gradient each."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(-1, 1, SIZE)
    base = rng.uniform(0.3, 0.7, (count, 1, 1, 3))
    slope = rng.uniform(-0.1, 0.1, (count, 2, 1, 1, 3))
    pixels = base + slope[:, 0] * ramp[:, None, None] + slope[:, 1] * ramp[None, :, None]
    return np.round(pixels.clip(0, 1) * 255).astype(np.uint8)


def plant_defect(image: np.ndarray) -> np.ndarray:
    """A flat square over ``DEFECT``, each channel 64 levels brighter or darker than the image there: a
    colour within the normal images' range, flat like them, but a step no smooth image has. A model that
    learnt nothing scores good images as high as these (checked: untrained, the scores overlap)."""
    damaged = image.astype(int)
    colour = damaged[DEFECT].mean(axis=(0, 1))
    damaged[DEFECT] = np.where(colour < 128, colour + 64, colour - 64).round()
    return damaged.astype(np.uint8)


def normalised(pixels: np.ndarray) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, 3, H, W) float, normalised as a checkpoint without a data record is read."""
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255
    return (x - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)


@pytest.fixture(scope="module")
def smooth_checkpoint(tmp_path_factory) -> Path:
    """A tiny pixel-target MAE (16 x 16) trained on smooth images (100 steps) until it continues them from
    context."""
    folder = tmp_path_factory.mktemp("smooth_mae")
    data = RandomImages(n=512, batch_size=64)
    data.data.tensors = (normalised(smooth_images(512, seed=1)), torch.zeros(512, dtype=torch.long))
    module = pretrain_module(norm_pix_loss=False, optim=dict(warmup_epochs=0, lr=2e-3))
    trainer = make_trainer(folder, max_steps=100, limit_val_batches=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # a model this small trains faster on one thread, and far faster on a busy machine
    try:
        trainer.fit(module, datamodule=data)
    finally:
        torch.set_num_threads(threads)
    trainer.save_checkpoint(folder / "last.ckpt")
    return folder / "last.ckpt"


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A tiny MAE after 2 steps: for the command's handling of its inputs, not for the quality of its
    scores."""
    return tiny_pretraining_checkpoint(tmp_path_factory.mktemp("tiny_mae"))


# ---------------------------------------------------------------- masks


@pytest.mark.parametrize(
    ("grid", "ratio", "masks", "hidden"), [((8, 8), 0.75, 4, 3), ((4, 4), 0.5, 2, 1), ((7, 7), 0.75, 49, 37)]
)
def test_complementary_masks__every_patch_hidden_the_same_number_of_times(grid, ratio, masks, hidden):
    L = grid[0] * grid[1]
    design = complementary_masks(grid, ratio, repeats=2, generator=torch.Generator().manual_seed(0))
    assert design.noise.shape == (2 * masks, L) and design.hidden_count == 2 * hidden
    # the masks as the model's own masking draws them from the scores
    _, mask, _ = random_masking(torch.zeros(2 * masks, L, 1), ratio, design.noise)
    assert (mask.sum(dim=1) == L - int(L * (1 - ratio))).all()  # each mask hides the model's count
    assert (mask.sum(dim=0) == 2 * hidden).all()  # every patch hidden equally often
    if ratio == 0.75 and L % 4 == 0:  # one permutation cut into 4 groups: each visible group is disjoint
        visible = 1 - mask[:masks]
        assert (visible.sum(dim=0) == 1).all()


def test_complementary_masks__refuse_ratios_that_hide_nothing_or_everything():
    for ratio in (0.0, 1.0, 0.99):
        with pytest.raises(ValueError, match="mask"):
            complementary_masks((4, 4), ratio)


# ---------------------------------------------------------------- scoring


def test_reconstruction_errors__match_one_forward_per_mask_and_the_loss_space():
    torch.manual_seed(0)
    for norm_pix_loss in (True, False):
        model = create_model(
            "mae_vit_tiny_patch4", img_size=SIZE, norm_pix_loss=norm_pix_loss, **TINY_KWARGS
        ).eval()
        imgs = torch.randn(3, 3, SIZE, SIZE)
        design = complementary_masks(model.grid_size, 0.75, generator=torch.Generator().manual_seed(1))
        errors = reconstruction_errors(model, imgs, design)
        # independently: every image under every mask through the model's forward, the loss's target
        total, count = torch.zeros(3, 16), torch.zeros(3, 16)
        for noise in design.noise:
            _, pred, mask = model(imgs, 0.75, noise.expand(3, -1))
            target = model.patchify(imgs)
            if norm_pix_loss:
                target = (target - target.mean(-1, keepdim=True)) / (
                    target.var(-1, keepdim=True) + 1e-6
                ) ** 0.5
            total += ((pred - target) ** 2).mean(-1) * mask
            count += mask
        torch.testing.assert_close(errors, total / count, rtol=1e-4, atol=1e-5)


def test_normal_statistics__standardise_per_position_with_a_floor():
    errors = torch.tensor([[1.0, 0.0, 5.0], [3.0, 0.0, 7.0]])  # position 1: every normal image perfect
    stats = NormalStatistics.of(errors)
    std = errors.std(dim=0)
    floor = NormalStatistics.FLOOR * std.mean()
    torch.testing.assert_close(
        stats.standardise(torch.tensor([[2.0, 1.0, 6.0]])), torch.tensor([[0.0, 1.0 / floor, 0.0]])
    )
    with pytest.raises(ValueError, match="at least 2 normal images"):
        NormalStatistics.of(errors[:1])
    assert stats.floored == 1  # position 1, floored (and counted, so the command can say so)
    with pytest.raises(ValueError, match="standard deviation 0 at every patch position"):
        NormalStatistics.of(torch.ones(3, 4))  # identical normal images: no scale to divide by
    with pytest.raises(ValueError, match="not all finite"):
        NormalStatistics.of(torch.tensor([[1.0, float("nan")], [2.0, 3.0]]))
    assert image_scores(torch.tensor([[1.0, 4.0, 2.0, 3.0]]), top_k=2).item() == 3.5


def test_anomaly_map__lights_up_a_planted_defect(smooth_checkpoint):
    from mae import load_mae

    model, _ = load_mae(smooth_checkpoint)
    model.eval()
    clean = smooth_images(6, seed=7)
    imgs = normalised(np.stack([*clean[:3], *(plant_defect(i) for i in clean[3:])]))
    design = complementary_masks(model.grid_size, 0.75, generator=torch.Generator().manual_seed(0))
    errors = reconstruction_errors(model, imgs, design)
    defect_patches = {4 * r + c for r in (0, 1) for c in (2, 3)}  # the patches the defect overlaps
    for image_errors in errors[3:]:
        assert int(image_errors.argmax()) in defect_patches
    scores = image_scores(errors, top_k=2)
    assert scores[3:].min() > scores[:3].max()


# ---------------------------------------------------------------- metrics


def test_image_and_pixel_auroc__equal_scikit_learn_on_the_same_scores():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 200)
    # ties included; large standard scores too (a sigmoid would round them all to 1)
    for scores in (np.round(rng.normal(size=200), 1), 40 + np.round(rng.normal(size=200), 2) + 10 * labels):
        expected = roc_auc_score(labels, scores)
        assert image_auroc(torch.tensor(scores, dtype=torch.float32), torch.tensor(labels)) == pytest.approx(
            expected
        )
    truth = torch.tensor(rng.random((4, 8, 8)) < 0.2)
    for maps in (
        np.round(rng.normal(size=(4, 8, 8)), 1),
        30 * rng.normal(size=(4, 8, 8)) + 50 * truth.numpy(),
    ):
        expected = roc_auc_score(truth.numpy().ravel(), maps.ravel())
        assert pixel_auroc(torch.tensor(maps), truth) == pytest.approx(expected)


def brute_force_aupro(maps: np.ndarray, truth: np.ndarray, max_fpr: float = 0.3) -> float:
    """AUPRO by its definition: every distinct score as a threshold, the overlap of every region counted."""
    regions = []
    for i, image in enumerate(truth):
        labelled, count = ndimage.label(image, structure=np.ones((3, 3)))
        regions += [(i, labelled == r) for r in range(1, count + 1)]
    points = [(0.0, 0.0)]
    for t in sorted(set(maps.ravel().tolist()), reverse=True):
        predicted = maps >= t
        fpr = (predicted & ~truth).sum() / (~truth).sum()
        pro = np.mean([(predicted[i] & region).sum() / region.sum() for i, region in regions])
        points.append((fpr, pro))
    area = 0.0
    for (x0, y0), (x1, y1) in zip(points[:-1], points[1:], strict=True):
        if x0 >= max_fpr:
            break
        if x1 > max_fpr:  # cut the last segment at the limit
            y1, x1 = y0 + (y1 - y0) * (max_fpr - x0) / (x1 - x0), max_fpr
        area += (x1 - x0) * (y0 + y1) / 2
    return area / max_fpr


def test_aupro__matches_its_definition_and_its_bounds():
    rng = np.random.default_rng(0)
    truth = np.zeros((3, 12, 12), bool)
    truth[0, 1:3, 1:3] = truth[0, 6:11, 5:10] = truth[1, 0:1, 7:12] = True  # 3 regions of 4, 25 and 5 pixels
    maps = np.round(rng.random((3, 12, 12)) + truth * rng.uniform(0, 0.8, truth.shape), 2)
    assert aupro(torch.tensor(maps), torch.tensor(truth)) == pytest.approx(brute_force_aupro(maps, truth))
    assert aupro(torch.tensor(truth * 1.0), torch.tensor(truth)) == pytest.approx(1.0)  # perfect map
    assert aupro(torch.tensor(~truth * 1.0), torch.tensor(truth)) == pytest.approx(0.0)  # inverted map
    with pytest.raises(ValueError, match="both defect pixels and defect-free pixels"):
        aupro(torch.zeros(1, 4, 4), torch.zeros(1, 4, 4, dtype=torch.bool))


def test_pixel_knn_baseline__per_patch_difference_to_the_nearest_normal_image():
    rng = torch.Generator().manual_seed(0)
    normal = torch.randn(5, 3, 8, 8, generator=rng)
    test = normal[[3, 1]] + 0.01 * torch.randn(2, 3, 8, 8, generator=rng)
    test[1, :, 4:, :4] += 2.0  # bottom-left patch of image 1 differs
    errors = nearest_normal_errors(test, normal, patch_size=4, chunk=1)
    for n, nearest in enumerate((3, 1)):  # independently, patch by patch
        for row in range(2):
            for col in range(2):
                patch = (slice(None), slice(4 * row, 4 * row + 4), slice(4 * col, 4 * col + 4))
                expected = ((test[n][patch] - normal[nearest][patch]) ** 2).mean()
                torch.testing.assert_close(errors[n, 2 * row + col], expected)
    assert int(errors[1].argmax()) == 2


# ---------------------------------------------------------------- the command


def write_tree(root: Path) -> Path:
    """A tiny MVTec AD layout of smooth images: train/good, test/good, test/checker, ground_truth/checker."""
    normal, test = smooth_images(8, seed=2), smooth_images(6, seed=3)
    for i, pixels in enumerate(normal):
        save(pixels, root / "train" / "good" / f"{i:03d}.png")
    for i, pixels in enumerate(test[:3]):
        save(pixels, root / "test" / "good" / f"{i:03d}.png")
    for i, pixels in enumerate(test[3:]):
        save(plant_defect(pixels), root / "test" / "checker" / f"{i:03d}.png")
        mask = np.zeros((SIZE, SIZE), np.uint8)
        mask[DEFECT] = 255
        save(mask, root / "ground_truth" / "checker" / f"{i:03d}_mask.png")
    return root


def save(pixels: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


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


# ---------------------------------------------------------------- the digit task


def test_digit_anomalies__deterministic_mvtec_layout_with_changed_pixels_as_ground_truth(tmp_path):
    import torchvision.transforms as T

    from mae.data.sources.builtin import DigitsDataset

    first = write_digit_anomalies(tmp_path / "a", seed=3, num_normal=4, num_test=8)
    again = write_digit_anomalies(tmp_path / "b", seed=3, num_normal=4, num_test=8)
    other = write_digit_anomalies(tmp_path / "c", seed=4, num_normal=4, num_test=8)

    def files(root):
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.png"))}

    assert files(first) == files(again) and files(first) != files(other)
    assert write_digit_anomalies(first, seed=3, num_normal=4, num_test=8) == first  # reused as it is
    with pytest.raises(ValueError, match="other parameters"):
        write_digit_anomalies(first, seed=5, num_normal=4, num_test=8)
    test_set = read_test_set(first / "test")
    assert test_set.has_masks and set(test_set.kinds) == {"good", *DEFECTS}
    assert sorted(p.name for p in (first / "train" / "good").iterdir()) == [
        "0001.png",
        "0002.png",
        "0003.png",
        "0004.png",
    ]
    # the clean digit as the digits data module's evaluation view serves it, independently
    val, resize = DigitsDataset("val"), T.Resize(32, interpolation=T.InterpolationMode.BICUBIC)
    for image in test_set.images:
        clean = np.asarray(resize(val[int(image.path.stem) // 5][0]))[..., 0].astype(int)
        seen = np.asarray(Image.open(image.path)).astype(int)
        if image.kind == "good":
            assert (seen == clean).all()
        else:
            truth = np.asarray(Image.open(image.mask)) > 0
            assert (truth == (np.abs(seen - clean) > CHANGED * 255)).all() and truth.sum() >= 6


def test_anomaly_benchmark__tiny_run_writes_the_table_and_figures(smooth_checkpoint, tmp_path):
    spec = importlib.util.spec_from_file_location("anomaly_benchmark", REPO / "benchmarks" / "anomaly.py")
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    tables = benchmark.main(
        [
            "--tasks-to-run",
            "digits",
            "--checkpoint",
            str(smooth_checkpoint),
            "--seeds",
            "0",
            "1",
            "--num-normal",
            "12",
            "--num-test",
            "8",
            "--img-size",
            str(SIZE),
            "--tasks",
            str(tmp_path / "tasks"),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    header, _, *rows = tables["digits"].splitlines()
    assert "F1 at the threshold" in header and "CPU s per seed" in header
    assert [row.split(" | ")[0] for row in rows] == [f"| {name}" for name in benchmark.SCORERS]
    out = tmp_path / "out" / "anomaly_digits"
    record = json.loads((out / "results.json").read_text())
    for runs in record["results"].values():
        assert len(runs) == 2 and all(0 <= run["image_f1"] <= 1 and run["cpu_seconds"] > 0 for run in runs)
    # the random encoder: another network than the pretrained one, drawn anew with each seed
    fingerprints = {
        json.loads((out / seed / tag / "metrics.json").read_text())["settings"]["fingerprint"]
        for seed in ("seed0", "seed1")
        for tag in ("features", "random")
    }
    assert len(fingerprints) == 3
    for name in ("table.md", "auroc.png", "heatmaps_seed0.png"):
        assert (out / name).stat().st_size > 0
