"""The feature-memory scorer (``mae.apps.anomaly.scorers.feature_memory``, ``mae anomaly --method
features``) end to end: fit and save on the MVTec AD layout, apply to the same images (identical
scores.csv) and to an unlabelled folder, and its refusals."""

import json
from pathlib import Path

import pytest
import torch

from mae.apps.anomaly.saved_scorer import RECORD, save_scorer
from tests.helpers import run_mae
from tests.unit.apps.anomaly.trees import rows


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
