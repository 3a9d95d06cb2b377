"""The feature-memory anomaly scorer (``mae.apps.anomaly.features``, ``mae anomaly --method features``) and
saved scorers (``mae.apps.anomaly.saved_scorer``): the greedy coreset and the blockwise nearest-neighbour
search against brute-force numpy, the features against the encoder's blocks run by hand, the smoothing
against a Gaussian kernel, the scorer files' refusals, and the command end to end: fit and save on the
MVTec AD layout, apply to the same images (identical scores.csv) and to an unlabelled folder, and its
refusals."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from mae.apps.anomaly import layout
from mae.apps.anomaly.digits import write_digit_anomalies
from mae.apps.anomaly.evaluation import score_test_set
from mae.apps.anomaly.features import (
    PROJECTION_DIM,
    coreset,
    feature_blocks,
    greedy_k_center,
    nearest_distances,
    patch_features,
    smooth_maps,
)
from mae.apps.anomaly.saved_scorer import RECORD, TENSORS, load_scorer, save_scorer
from mae.io.outputs import OutputError
from tests.helpers import run_mae, tiny_pretraining_checkpoint


def numpy_greedy(points: np.ndarray, k: int, start: int) -> list[int]:
    """Greedy k-center by its definition: the full distance matrix, each pick the point whose distance to
    its nearest pick so far is largest."""
    distances = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
    picks = [start]
    while len(picks) < k:
        picks.append(int(distances[:, picks].min(axis=1).argmax()))
    return picks


def test_greedy_k_center__same_picks_in_the_same_order_as_brute_force():
    points = np.random.default_rng(0).normal(size=(50, 5))
    for start in (0, 17, 49):
        picks = greedy_k_center(torch.tensor(points, dtype=torch.float32), 12, start)
        assert picks.tolist() == numpy_greedy(points, 12, start)


def test_coreset__greedy_on_a_seeded_random_projection():
    features = torch.randn(50, PROJECTION_DIM + 22, generator=torch.Generator().manual_seed(1))
    picked = coreset(features, 0.2, seed=3)
    # independently: the projection and the start drawn from the seed, then greedy by its definition
    generator = torch.Generator().manual_seed(3)
    projected = (features @ torch.randn(PROJECTION_DIM + 22, PROJECTION_DIM, generator=generator)).numpy()
    start = int(torch.randint(50, (1,), generator=generator))
    assert picked.tolist() == sorted(numpy_greedy(projected.astype(np.float64), 10, start))
    assert picked.tolist() != coreset(features, 0.2, seed=4).tolist()  # the seed matters
    assert coreset(features, 1.0).tolist() == list(range(50))
    assert len(coreset(features, 0.001)) == 1  # at least one vector
    with pytest.raises(ValueError, match=r"--coreset-fraction must be in \(0, 1\], got 0"):
        coreset(features, 0)


@pytest.mark.parametrize(("query_block", "bank_block"), [(5, 7), (37, 53), (1, 100), (64, 4)])
def test_nearest_distances__equal_brute_force_for_any_blocks(query_block, bank_block):
    rng = np.random.default_rng(0)
    bank, queries = rng.normal(size=(53, 6)), rng.normal(size=(37, 6))
    queries[4] = bank[30]  # an exact match scores 0
    expected = np.sqrt(((queries[:, None] - bank[None]) ** 2).sum(-1)).min(axis=1)
    found = nearest_distances(
        torch.tensor(queries, dtype=torch.float32),
        torch.tensor(bank, dtype=torch.float32),
        query_block,
        bank_block,
    )
    np.testing.assert_allclose(found.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert found[4] == 0


def test_patch_features__blocks_concatenated_and_averaged_over_the_neighbourhood():
    torch.manual_seed(0)
    encoder = VisionTransformer(img_size=16, patch_size=4, embed_dim=8, depth=3, num_heads=2).eval()
    imgs = torch.randn(2, 3, 16, 16)
    with torch.no_grad():  # the blocks by hand
        x = encoder._pos_embed(encoder.patch_embed(imgs))
        outputs = []
        for block in encoder.blocks:
            x = block(x)
            outputs.append(x[:, 1:])  # the patch tokens, no cls
    expected = torch.cat([outputs[0], outputs[2]], dim=2)  # (2, 16, 16): a 4 x 4 grid, 2 x 8 features
    torch.testing.assert_close(patch_features(encoder, imgs, [0, 2], neighbourhood=1), expected)
    averaged = patch_features(encoder, imgs, [2], neighbourhood=3).numpy()
    grid = outputs[2].reshape(2, 4, 4, 8).numpy()
    for row, col in ((0, 0), (1, 2), (3, 3)):  # a corner (4 neighbours inside), the middle (9), a corner
        window = grid[:, max(row - 1, 0) : row + 2, max(col - 1, 0) : col + 2]
        np.testing.assert_allclose(averaged[:, 4 * row + col], window.mean(axis=(1, 2)), rtol=1e-5, atol=1e-6)


def test_feature_blocks__default_the_last_indices_from_either_end_refused_outside_the_depth():
    assert feature_blocks(None, 12) == [11]
    assert feature_blocks([-1, -3], 12) == [9, 11] and feature_blocks([0, 5], 12) == [0, 5]
    with pytest.raises(ValueError, match="--feature-blocks 12 is not a block of this encoder of depth 12"):
        feature_blocks([-1, 12], 12)
    with pytest.raises(ValueError, match="--feature-blocks -13 is not a block of this encoder of depth 12"):
        feature_blocks([-13], 12)
    with pytest.raises(ValueError, match="names a block twice"):
        feature_blocks([11, -1], 12)
    with pytest.raises(ValueError, match="takes 1 to 3 blocks, got 4"):
        feature_blocks([0, 1, 2, 3], 12)


def test_maps_smoothed_by_a_gaussian_and_the_image_score_the_highest_patch(tmp_path):
    delta = torch.zeros(1, 41, 41)
    delta[0, 20, 20] = 1.0
    offsets = np.arange(-16, 17)  # scipy's truncation: 4 sigma
    kernel = np.exp(-(offsets**2) / (2 * 4.0**2))
    kernel /= kernel.sum()
    np.testing.assert_allclose(
        smooth_maps(delta, 4.0)[0, 4:37, 4:37].numpy(), np.outer(kernel, kernel), atol=1e-7
    )
    # through the scoring of a test set: top-k 1 is the highest patch; the map the smoothed upsampling
    two = [layout.TestImage(tmp_path / "a.png"), layout.TestImage(tmp_path / "b.png")]
    images = layout.TestSet(tmp_path, two, has_masks=False)
    errors = torch.tensor([[0.0, 1.0, 0.0, 5.0], [2.0, 0.0, 0.0, 0.0]])
    plain = score_test_set(errors, images, (2, 2), (8, 8), top_k=1)
    smoothed = score_test_set(errors, images, (2, 2), (8, 8), top_k=1, sigma=4.0)
    assert smoothed.scores.tolist() == [5.0, 2.0] == plain.scores.tolist()
    torch.testing.assert_close(smoothed.maps, smooth_maps(plain.maps, 4.0))
    assert smoothed.maps.max() < plain.maps.max()


def test_saved_scorer__round_trip_and_refusals(tmp_path):
    tensors, record = {"bank": torch.randn(5, 3)}, {"method": "features", "settings": {"top_k": 1}}
    folder = save_scorer(tmp_path / "scorer", tensors, record)
    saved = load_scorer(folder)
    torch.testing.assert_close(saved.tensors["bank"], tensors["bank"], rtol=0, atol=0)
    assert saved.record["settings"] == {"top_k": 1} and saved.record["format"] == "mae-anomaly-scorer"
    save_scorer(folder, tensors, record)  # its own folder: replaced
    edited = json.loads((folder / RECORD).read_text())
    (folder / RECORD).write_text(json.dumps({**edited, "settings": {"top_k": 3}}))  # a lying record
    with pytest.raises(ValueError, match="scorer.json is not the record scorer.safetensors was saved with"):
        load_scorer(folder)
    save_scorer(folder, tensors, record)
    with pytest.raises(FileNotFoundError, match="--scorer .*nowhere is not a folder"):
        load_scorer(tmp_path / "nowhere")
    (folder / TENSORS).write_bytes((folder / TENSORS).read_bytes()[:-4])  # cut off
    with pytest.raises(ValueError, match="scorer.safetensors is not the file scorer.json records"):
        load_scorer(folder)
    (folder / RECORD).write_text(json.dumps({"name": "something else"}))
    with pytest.raises(ValueError, match='scorer.json is not a scorer record of mae anomaly \\(no "format"'):
        load_scorer(folder)
    (folder / TENSORS).unlink()
    with pytest.raises(FileNotFoundError, match="holds no scorer.safetensors"):
        load_scorer(folder)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="holds files that no run of mae anomaly wrote"):
        save_scorer(other, tensors, record)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


# ---------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny pretraining checkpoint (16 x 16, depth 1) and a small digit task (10 normal, 8 test)."""
    root = tmp_path_factory.mktemp("features")
    checkpoint = tiny_pretraining_checkpoint(root / "mae")
    return checkpoint, write_digit_anomalies(root / "digits", seed=0, num_normal=10, num_test=8)


def rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_features_command__fit_save_and_apply_gives_identical_scores(task, tmp_path):
    checkpoint, digits = task
    normal, test, scorer = digits / "train" / "good", digits / "test", tmp_path / "sc"
    fit = ["--method", "features", "--checkpoint", str(checkpoint), "--normal", str(normal)]
    fit += ["--save-scorer", str(scorer), "--figures", "overview", "--coreset-fraction", "0.25"]
    fitted = run_mae("anomaly", *fit, "--test", str(test), "--out", str(tmp_path / "fit"))
    assert "128 patch vectors of length 32, 32 kept in the bank" in fitted.stdout  # 8 fitted, 2 held out
    metrics = json.loads((tmp_path / "fit" / "metrics.json").read_text())
    assert {"image_auroc", "pixel_auroc", "aupro"} <= set(metrics)
    assert metrics["settings"]["method"] == "features" and metrics["settings"]["top_k"] == 1
    assert (tmp_path / "fit" / "overview.png").is_file()
    record = json.loads((tmp_path / "sc" / "scorer.json").read_text())
    assert record["settings"]["bank_size"] == 32 and record["preprocessing"]["img_size"] == [16, 16]
    assert record["encoder"]["checkpoint"] == str(checkpoint) and record["decision"]["chosen_by"]
    # applied, with no --normal: the same bytes
    apply = ["--scorer", str(scorer), "--figures", "none", "--out"]
    run_mae("anomaly", *apply, str(tmp_path / "again"), "--test", str(test))
    assert (tmp_path / "again" / "scores.csv").read_bytes() == (tmp_path / "fit" / "scores.csv").read_bytes()
    # an unlabelled folder: the same scores for the same images, no metrics
    run_mae("anomaly", *apply, str(tmp_path / "plain"), "--test", str(test / "good"))
    plain = {r["path"]: r["score"] for r in rows(tmp_path / "plain" / "scores.csv")}
    assert plain == {
        r["path"][5:]: r["score"] for r in rows(tmp_path / "fit" / "scores.csv") if r["kind"] == "good"
    }
    assert not (tmp_path / "plain" / "metrics.json").exists()


@pytest.mark.slow
def test_features_command__refuses_another_encoder_size_missing_scorer_and_refitting(task, tmp_path):
    checkpoint, digits = task
    test = ("--test", str(digits / "test"))
    save_scorer(tmp_path / "sc", {"bank": torch.zeros(2, 32)}, _record(checkpoint))
    state = torch.load(checkpoint, weights_only=False)
    state["state_dict"]["model.patch_embed.proj.weight"] += 1
    torch.save(state, tmp_path / "other.ckpt")
    fingerprint = json.loads((tmp_path / "sc" / RECORD).read_text())["encoder"]["fingerprint"]
    cases = [
        (
            ["--scorer", str(tmp_path / "sc"), "--checkpoint", str(tmp_path / "other.ckpt")],
            f"is not the encoder of --scorer {tmp_path / 'sc'}: {checkpoint} (weights {fingerprint[:12]})",
        ),
        (["--scorer", str(tmp_path / "sc"), "--img-size", "32"], "--img-size 32 is not the size of --scorer"),
        (["--scorer", str(tmp_path / "nowhere")], f"--scorer {tmp_path / 'nowhere'} is not a folder"),
        (
            ["--scorer", str(tmp_path / "sc"), "--normal", str(digits / "train" / "good")],
            "is fitted already: leave out --normal",
        ),
        (
            [
                "--method",
                "features",
                "--checkpoint",
                str(checkpoint),
                "--normal",
                str(digits),
                "--feature-blocks",
                "-2",
            ],
            "--feature-blocks -2 is not a block of this encoder of depth 1",
        ),
        (["--method", "features", "--normal", str(digits)], "--method features needs --checkpoint"),
    ]
    for args, message in cases:
        result = run_mae("anomaly", *args, *test, "--out", str(tmp_path / "out"), check=False)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()
    # the recorded encoder itself is accepted; its scores need no --normal
    run_mae(
        "anomaly",
        "--scorer",
        str(tmp_path / "sc"),
        *test,
        "--out",
        str(tmp_path / "out"),
        "--figures",
        "none",
    )
    assert len(rows(tmp_path / "out" / "scores.csv")) == 8


@pytest.mark.slow
def test_saved_scorer__mae_and_pixel_knn_applied_with_identical_scores_and_only_with_their_own_model(
    task, tmp_path
):
    checkpoint, digits = task
    normal, test = ("--normal", str(digits / "train" / "good")), ("--test", str(digits / "test"))
    fits = {
        "mae": ["--checkpoint", str(checkpoint), "--seed", "3", "--top-k", "2"],
        "pixel-knn": ["--img-size", "32", "--patch-size", "8"],
    }
    for method, flags in fits.items():
        scorer, fit = tmp_path / f"{method}_scorer", tmp_path / f"{method}_fit"
        fit_args = ["--method", method, *flags, *normal, "--save-scorer", str(scorer)]
        run_mae("anomaly", *fit_args, *test, "--out", str(fit), "--figures", "none")
        run_mae(
            "anomaly", "--scorer", str(scorer), *test, "--out", str(tmp_path / method), "--figures", "none"
        )
        assert (tmp_path / method / "scores.csv").read_bytes() == (fit / "scores.csv").read_bytes()
        fitted = json.loads((fit / "metrics.json").read_text())
        applied = json.loads((tmp_path / method / "metrics.json").read_text())
        assert applied["decision"] == fitted["decision"] and applied["settings"]["normal"] == normal[1]
    record = json.loads((tmp_path / "mae_scorer" / RECORD).read_text())
    assert record["method"] == "mae" and record["settings"]["seed"] == 3 and record["settings"]["top_k"] == 2
    assert set(load_scorer(tmp_path / "mae_scorer").tensors) == {"mean", "scale"}
    knn = load_scorer(tmp_path / "pixel-knn_scorer")
    assert knn.tensors["reference"].shape == (8, 3, 32, 32)  # 10 normal images, 2 held out
    assert knn.record["settings"]["patch_size"] == 8 and knn.record["preprocessing"]["img_size"] == [32, 32]
    # another decoder, the same encoder: the MAE's scores change, so its scorer refuses it
    state = torch.load(checkpoint, weights_only=False)
    state["state_dict"]["model.decoder_embed.weight"] += 1
    torch.save(state, tmp_path / "other_decoder.ckpt")
    mae_scorer, knn_scorer = str(tmp_path / "mae_scorer"), str(tmp_path / "pixel-knn_scorer")
    weights = record["encoder"]["fingerprint"][:12]
    cases = [
        (
            ["--scorer", mae_scorer, "--checkpoint", str(tmp_path / "other_decoder.ckpt")],
            f"is not the encoder of --scorer {mae_scorer}: {checkpoint.resolve()} (weights {weights})",
        ),
        (["--scorer", mae_scorer, "--img-size", "32"], "--img-size 32 is not the size of --scorer"),
        (["--scorer", mae_scorer, "--seed", "3"], f"--seed is fixed by --scorer {mae_scorer} (3); leave it"),
        (["--scorer", mae_scorer, "--raw-errors"], "--raw-errors is fixed by --scorer"),
        (["--scorer", knn_scorer, "--img-size", "64"], "--img-size 64 is not the size of --scorer"),
        (["--scorer", knn_scorer, "--patch-size", "4"], "--patch-size is fixed by --scorer"),
    ]
    for args, message in cases:
        result = run_mae("anomaly", *args, *test, "--out", str(tmp_path / "out"), check=False)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def _record(checkpoint: Path) -> dict:
    """The record of a scorer of ``checkpoint``'s encoder at 16 x 16, by its fingerprint."""
    from mae.apps.embeddings.embedder import weights_fingerprint
    from mae.convert.sources import read_checkpoint

    settings = {"feature_blocks": [0], "neighbourhood": 3, "coreset_fraction": 1.0, "seed": 0, "top_k": 1}
    return {
        "method": "features",
        "settings": {**settings, "sigma": 4.0, "bank_size": 2, "normal_patches": 2},
        "normal": "elsewhere",
        "normal_images": 1,
        "preprocessing": {"img_size": [16, 16], "in_chans": 3, "mean": [0.5] * 3, "std": [0.25] * 3},
        "encoder": {
            "checkpoint": str(checkpoint),
            "fingerprint": weights_fingerprint(read_checkpoint(checkpoint)),
        },
        "decision": None,
    }
