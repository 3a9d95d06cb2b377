"""``mae export --to timm|huggingface``: folders timm and transformers load, with a model card filled from
the run; the output rule for folders (links written through, the current folder refused); a fine-tuned
classifier with its head; refusals of what a target cannot hold."""

import csv
import os
import re
import shutil
from pathlib import Path

import pytest
import timm
import torch

from mae.convert.architecture import mae_record
from mae.convert.backbone import load_backbone
from mae.convert.sharded_checkpoint import META_FILE
from tests.forked_commands import run_forked
from tests.helpers import TINY_MODEL, csv_logger, run_mae, write_config
from tests.unit.convert.test_sharded_checkpoint import write_sharded

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


@pytest.fixture(scope="module")
def finetuned_checkpoint(run_checkpoint, tmp_path_factory) -> Path:
    """The last checkpoint of ``mae finetune`` (global average pooling, fc_norm, a 10-class head) of the
    pretraining run, after one epoch of 2 steps and one validation batch (``val/acc1``, ``val/acc5``
    logged as fractions in its metrics.csv)."""
    tmp = tmp_path_factory.mktemp("finetune")
    finetune = {
        "seed_everything": 0,
        "model": {"encoder": {"checkpoint": str(run_checkpoint)}, "optim": {"warmup_epochs": 0}},
        "data": {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 16, "batch_size": 16}},
        "trainer": {
            "max_epochs": 1,
            "limit_train_batches": 2,
            "limit_val_batches": 1,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "logger": csv_logger(tmp, "ft"),
        },
    }
    run_mae("finetune", "--config", str(write_config(tmp, finetune, "finetune")))
    return next(tmp.rglob("last.ckpt"))


def _export(checkpoint: Path, out: Path, *args: str, check: bool = True):
    return run_mae("export", "--checkpoint", str(checkpoint), "--out", str(out), *args, check=check)


def _timm_features(folder: Path, images: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return timm.create_model(f"local-dir:{folder}", pretrained=True).eval().forward_features(images)


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

    # the card's own command line: the option it names fine-tunes the folder
    assert f"`mae finetune --model.encoder.checkpoint {out.name} ...` fine-tunes it." in card
    finetune = {
        "model": {"optim": {"warmup_epochs": 0}},
        "data": {"class_path": "mae.data.DigitsDataModule", "init_args": {"img_size": 16, "batch_size": 16}},
        "trainer": {
            "max_steps": 1,
            "limit_val_batches": 1,
            "accelerator": "cpu",
            "enable_progress_bar": False,
            "logger": csv_logger(tmp_path, "ft"),
        },
    }
    config = str(write_config(tmp_path, finetune, "finetune"))
    tuned = run_mae("finetune", "--config", config, "--model.encoder.checkpoint", str(out))
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

    encoder_only = _export(run_checkpoint, out, "--to", "huggingface", "--encoder-only")  # replaced
    assert transformers.ViTMAEModel.from_pretrained(out).config.architectures == ["ViTMAEModel"]
    # The line printed loads the encoder with every patch: ViTMAEModel masks 75 % of them by default.
    assert f'ViTMAEModel.from_pretrained("{out}", mask_ratio=0.0)' in encoder_only.stdout


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


def test_export_folder__a_link_is_written_through_and_stays_a_link_to_the_same_folder(
    run_checkpoint, finetuned_checkpoint, tmp_path
):
    target, link = tmp_path / "exports" / "encoder", tmp_path / "encoder_link"
    target.parent.mkdir()
    _export(run_checkpoint, target, "--to", "huggingface")  # a previous export in the link's folder
    link.symlink_to(target, target_is_directory=True)

    result = _export(finetuned_checkpoint, link, "--to", "timm")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert sorted(p.name for p in target.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert "10-class classifier" in (target / "README.md").read_text()  # the new export, not the old one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["encoder_link", "exports"]  # nothing renamed aside
    assert [p.name for p in target.parent.iterdir()] == ["encoder"]  # no temporary folder left
    assert f"to {link}/" in result.stdout

    empty, empty_link = tmp_path / "exports" / "empty", tmp_path / "empty_link"
    empty.mkdir()
    empty_link.symlink_to(empty, target_is_directory=True)
    _export(run_checkpoint, empty_link, "--to", "timm")
    assert empty_link.is_symlink() and (empty / "model.safetensors").is_file()
    images = torch.randn(2, 3, 16, 16)
    ours = load_backbone(run_checkpoint).eval()
    with torch.no_grad():
        assert (_timm_features(empty_link, images) - ours.forward_features(images)).abs().max() <= 1e-5


def test_export_folder__the_current_folder_and_a_folder_holding_the_input_are_refused_by_name(
    run_checkpoint, tmp_path
):
    here = tmp_path / "here"
    here.mkdir()
    real = Path(os.path.realpath(here))
    for out in (".", "../here", str(here)):
        argv = ["-m", "mae", "export", "--checkpoint", str(run_checkpoint), "--to", "timm", "--out", out]
        refused = run_forked(argv, here, 300)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert f"error: --out {out} is the current folder ({real})" in refused.stderr
        assert f"run it from {real.parent} with --out here" in refused.stderr
    assert list(here.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["here"]

    _export(run_checkpoint, tmp_path / "timm", "--to", "timm")
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "timm").iterdir()}
    inside = _export(tmp_path / "timm" / "model.safetensors", tmp_path / "timm", "--to", "timm", check=False)
    assert inside.returncode == 2
    assert f"--out {tmp_path / 'timm'} holds the input --checkpoint" in inside.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "timm").iterdir()} == before


def test_export_finetuned_classifier__timm_folder_gives_the_same_logits_and_a_card_in_percent(
    finetuned_checkpoint, tmp_path
):
    out = tmp_path / "classifier_timm"
    result = _export(finetuned_checkpoint, out, "--to", "timm")
    assert "a 10-class classifier (global average pooling)" in result.stdout
    model = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    ours = load_backbone(finetuned_checkpoint, global_pool="avg", num_classes=10).eval()
    images = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        assert (model(images) - ours(images)).abs().max() <= 1e-6
    assert model.num_classes == 10 and model.global_pool == "avg"

    card = (out / "README.md").read_text()
    with open(finetuned_checkpoint.parents[1] / "metrics.csv") as f:
        row = [row for row in csv.DictReader(f) if row["val/acc5"]][-1]
    top1, top5 = 100 * float(row["val/acc1"]), 100 * float(row["val/acc5"])
    assert top5 > 1  # a fraction copied as it is would read below 1 %
    assert (
        f"| fine-tuning top-1 | {top1:.2f} | 1 |" in card
        and f"| fine-tuning top-5 | {top5:.2f} | 1 |" in card
    )
    assert "pipeline_tag: image-classification" in card and "(1, 10) class scores" in card

    refused = _export(finetuned_checkpoint, tmp_path / "classifier_hf", "--to", "huggingface", check=False)
    assert refused.returncode == 2
    assert (
        "is a 10-class classifier (global average pooling): Hugging Face transformers' ViT" in refused.stderr
    )
    assert "export it with --to timm" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["classifier_timm"]


def _sharded_run(run_checkpoint: Path, run: Path, devices: str) -> Path:
    """The pretraining run as a sharded run folder ``run``: its checkpoint as a sharded folder in
    ``checkpoints/``, its metrics and its config.yaml with ``trainer.devices`` set to ``devices``."""
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(run_checkpoint.parents[1] / "metrics.csv", run)
    config = (run_checkpoint.parents[1] / "config.yaml").read_text()
    assert "  devices: 1\n" in config
    (run / "config.yaml").write_text(config.replace("  devices: 1\n", f"  devices: {devices}\n"))
    write_sharded(run_checkpoint, run / "checkpoints" / "last.ckpt")
    return run / "checkpoints" / "last.ckpt"


def test_export_of_a_sharded_run__the_card_counts_the_images_of_devices_stored_as_text(
    run_checkpoint, tmp_path
):
    sharded = _sharded_run(run_checkpoint, tmp_path / "run", "'2'")  # as --trainer.devices 2 is stored
    _export(sharded, tmp_path / "timm", "--to", "timm")
    card = (tmp_path / "timm" / "README.md").read_text()
    assert "Trained for 1 epochs, 2 optimizer steps, 64 images seen" in card  # 2 x 16 x 2 devices


def test_export_of_a_sharded_folder_missing_meta_pt__names_the_missing_file(run_checkpoint, tmp_path):
    sharded = _sharded_run(run_checkpoint, tmp_path / "run", "1")
    (sharded / META_FILE).unlink()
    missing = _export(sharded, tmp_path / "timm", "--to", "timm", check=False)
    assert missing.returncode == 2
    assert f"error: {sharded} is a sharded checkpoint folder (1 .distcp shard file(s)) missing meta.pt" in (
        missing.stderr
    )
    assert "Hugging Face" not in missing.stderr and not (tmp_path / "timm").exists()
