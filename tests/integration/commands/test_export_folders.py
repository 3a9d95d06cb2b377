"""``mae export --to timm|huggingface``: folders timm and transformers load, with a model card filled from
the run; the output rule for folders; refusals of what a target cannot hold."""

import csv
import re
from pathlib import Path

import pytest
import timm
import torch

from mae.convert.architecture import mae_record
from mae.convert.backbone import load_backbone
from tests.helpers import TINY_MODEL, csv_logger, run_mae, write_config

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def run_checkpoint(tmp_path_factory) -> Path:
    """The last checkpoint of a 2-step pretraining run on the digits (16x16) with a kNN monitor, in its
    run folder (config.yaml, metrics.csv)."""
    tmp = tmp_path_factory.mktemp("run")
    config = {
        "seed_everything": 0,
        "model": {**TINY_MODEL, "optim": {"warmup_epochs": 0}},
        "data": {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 16, "batch_size": 16}},
        "trainer": {
            "max_epochs": 1,
            "limit_train_batches": 2,
            "limit_val_batches": 1,
            "accelerator": "cpu",
            "devices": 1,
            "enable_progress_bar": False,
            "logger": csv_logger(tmp, "card"),
        },
        "knn": {"every_n_epochs": 1, "max_train": 64, "max_val": 32},
        "reconstruction": {"every_n_epochs": 0},
    }
    run_mae("pretrain", "--config", str(write_config(tmp, config, "config")))
    return next(tmp.rglob("last.ckpt"))


def _export(checkpoint: Path, out: Path, *args: str, check: bool = True):
    return run_mae("export", "--checkpoint", str(checkpoint), "--out", str(out), *args, check=check)


def test_export_to_timm__loads_in_timm_with_the_same_features_and_a_card_from_the_run(
    run_checkpoint, tmp_path
):
    out = tmp_path / "encoder_timm"
    result = _export(run_checkpoint, out, "--to", "timm")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert f'timm.create_model("local-dir:{out}", pretrained=True)' in result.stdout
    model = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        diff = model.forward_features(images) - load_backbone(run_checkpoint).eval().forward_features(images)
    assert diff.abs().max() <= 1e-5

    card = (out / "README.md").read_text()
    front = card.split("---")[1]
    assert "library_name: timm" in front and "license: other" in front and "- DigitsDataModule" in front
    with open(run_checkpoint.parents[1] / "metrics.csv") as f:
        knn = [float(row["val/knn_acc1"]) for row in csv.DictReader(f) if row["val/knn_acc1"]][-1]
    assert f"| kNN top-1 | {knn:.2f} | 1 | weighted kNN (k=20, temperature 0.07)" in card
    assert f"value: {round(knn, 2)}" in front  # model-index
    assert "Trained for 1 epochs, 2 optimizer steps, 32 images seen" in card
    assert "mean [0.485, 0.456, 0.406] and std [0.229, 0.224, 0.225]" in card
    assert "embed_dim: 32" in card and "Masked Autoencoders Are Scalable Vision Learners" in card

    finetune = {
        "model": {"encoder": {"checkpoint": str(out)}, "optim": {"warmup_epochs": 0}},
        "data": {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 16, "batch_size": 16}},
        "trainer": {
            "max_steps": 1,
            "limit_val_batches": 1,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "logger": csv_logger(tmp_path, "ft"),
        },
    }
    tuned = run_mae("finetune", "--config", str(write_config(tmp_path, finetune, "finetune")))
    assert f"from {out} (timm format)" in tuned.stdout + tuned.stderr


def test_export_to_huggingface__with_decoder_then_encoder_only_into_the_same_folder(run_checkpoint, tmp_path):
    out = tmp_path / "hf"
    result = _export(run_checkpoint, out, "--to", "huggingface")
    assert "ViTMAEForPreTraining.from_pretrained" in result.stdout
    assert (out / "preprocessor_config.json").is_file() and "library_name: transformers" in (
        out / "README.md"
    ).read_text()
    hf = transformers.ViTMAEForPreTraining.from_pretrained(out).eval()
    mae_model = torch.load(run_checkpoint, weights_only=False)["hyper_parameters"]
    assert hf.config.mask_ratio == mae_model["mask_ratio"] and hf.config.norm_pix_loss

    _export(run_checkpoint, out, "--to", "huggingface", "--encoder-only")  # the same folder, replaced
    assert transformers.ViTMAEModel.from_pretrained(out).config.architectures == ["ViTMAEModel"]


def test_export_folder__refuses_foreign_files_and_replaces_its_own_whole(run_checkpoint, tmp_path):
    out = tmp_path / "shared"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    refused = _export(run_checkpoint, out, "--to", "timm", check=False)
    assert refused.returncode == 2
    assert f"error: --out {out} holds files that no run of mae export wrote (notes.txt)" in refused.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]

    (out / "notes.txt").unlink()
    _export(run_checkpoint, out, "--to", "huggingface")
    _export(run_checkpoint, out, "--to", "timm")  # a rerun replaces the whole folder
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["shared"]  # no temporary folder left behind


def test_export_folder__what_a_target_cannot_hold_is_refused_before_anything_is_written(tmp_path):
    torch.manual_seed(0)
    from mae.models import MaskedAutoencoderViT

    model = MaskedAutoencoderViT(
        img_size=(16, 24),
        patch_size=4,
        embed_dim=32,
        depth=1,
        num_heads=2,
        decoder_embed_dim=16,
        decoder_depth=1,
    )
    checkpoint = tmp_path / "wide.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "pytorch-lightning_version": "2.6.6",
            "mae_architecture": mae_record(model.config),
        },
        checkpoint,
    )
    refused = _export(checkpoint, tmp_path / "hf", "--to", "huggingface", check=False)
    assert refused.returncode == 2
    assert re.search(r"error: .*square inputs only, got img_size 16x24", refused.stderr)
    usage = _export(checkpoint, tmp_path / "t", "--to", "timm", "--encoder-only", check=False)
    assert usage.returncode == 2 and "--encoder-only: for --to huggingface only" in usage.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wide.ckpt"]
