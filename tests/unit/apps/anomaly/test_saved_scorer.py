"""Saved scorers (``mae.apps.anomaly.saved_scorer``): the files' round trip and refusals, scorers saved by
mae 0.3.0 (``tests/data/anomaly_scorers_v0.3.0``) loading and scoring as they did, and the mae and
pixel-kNN scorers applied by the command with identical scores and only with their own model."""

import json

import pytest
import torch

from mae.apps.anomaly.layout import read_test_set
from mae.apps.anomaly.saved_scorer import RECORD, TENSORS, VERSION, SavedScorer, load_scorer, save_scorer
from mae.apps.anomaly.scorers import SCORERS
from mae.apps.anomaly.scorers.base import ModelInputs, Reading
from mae.apps.anomaly.threshold import Decision
from mae.cli.main import invoke
from mae.io.outputs import OutputError
from tests.helpers import REPO, run_mae


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
    (folder / RECORD).write_text(json.dumps({**edited, "version": 3}))
    with pytest.raises(ValueError, match="is a scorer of version 3; this mae reads versions 1, 2: save"):
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


V030 = REPO / "tests" / "data" / "anomaly_scorers_v0.3.0"  # written by mae 0.3.0: its README says how
V030_MODEL = REPO / "tests" / "data" / "legacy_pretrain_v0.1.ckpt"


@pytest.mark.parametrize("method", ["mae", "pixel-knn", "features"])
def test_saved_scorer__written_by_0_3_0_loads_and_scores_identically(method, tmp_path):
    folder, images = V030 / method, V030 / "images"
    saved = load_scorer(folder)
    assert saved.record["method"] == method and saved.record["decision"]["chosen_by"] == "normal-quantile"
    model = ModelInputs(checkpoint=None if method == "pixel-knn" else V030_MODEL)
    scorer = SCORERS[method].load(saved, folder, model, Reading())
    result = scorer.score(read_test_set(images), Reading())
    expected = json.loads((V030 / "scores.json").read_text())[method]
    # fp32 sums in an order that follows the thread count: seen 2.1e-6 apart (relative 2.4e-6) in the suite
    torch.testing.assert_close(result.scores, torch.tensor(expected["scores"]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        result.patch_scores, torch.tensor(expected["patch_scores"]), rtol=1e-5, atol=1e-6
    )
    # through the command, as 0.3.0 applied it: the same scores.csv, its saved decision included
    checkpoint = [] if method == "pixel-knn" else ["--checkpoint", str(V030_MODEL)]
    out = tmp_path / "out"
    invoke(
        "anomaly",
        ["--scorer", str(folder), *checkpoint, "--test", str(images), "--out", str(out), "--figures", "none"],
    )
    assert (out / "scores.csv").read_text() == (V030 / f"{method}_scores.csv").read_text()


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


def test_saved_scorer__version_1_decisions_read_under_todays_rule_and_saved_again_as_version_2(tmp_path):
    """Version 1 (mae 0.3, 0.4) flagged ``score >= threshold``: its F1 threshold (the lowest score flagged)
    is read as the float32 just below, flagging the same images under ``>``; its quantile thresholds as
    they are. Saved again, it is version 2, whatever record it came from."""
    saved = load_scorer(V030 / "pixel-knn")
    assert saved.record["version"] == 1
    knn = SCORERS["pixel-knn"]
    quantile = knn.load(saved, V030 / "pixel-knn", ModelInputs(), Reading()).own_decision()
    assert quantile == Decision.from_json(saved.record["decision"])  # normal-quantile: as saved
    f1 = {**saved.record["decision"], "chosen_by": "validation-f1", "quantile": None}
    by_f1 = SavedScorer(saved.tensors, {**saved.record, "decision": f1})
    decision = knn.load(by_f1, V030 / "pixel-knn", ModelInputs(), Reading()).own_decision()
    scores = torch.tensor([f1["image_threshold"], f1["image_threshold"] * 0.999]).float()
    assert decision.anomalous(scores).tolist() == (scores >= f1["image_threshold"]).tolist() == [True, False]
    assert (
        decision.image_threshold < f1["image_threshold"] and decision.pixel_threshold < f1["pixel_threshold"]
    )
    again = load_scorer(save_scorer(tmp_path / "again", saved.tensors, saved.record))
    assert again.record["version"] == VERSION == 2 and again.record["decision"] == saved.record["decision"]
