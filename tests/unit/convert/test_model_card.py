"""The model card: the encoder page shows the card of the recorded default run, regenerated here; the
licence of runs started from the official MAE weights; images seen from the devices as config.yaml stores
them; accuracies in percent."""

import importlib.util
from pathlib import Path

import pytest

from mae.convert.exports import huggingface
from mae.convert.model_card import (
    OFFICIAL_LICENSE,
    RunFacts,
    _evaluations,
    _images_seen,
    _recipe,
    card_license,
    device_count,
    model_card,
)

REPO = Path(__file__).resolve().parents[3]


def _benchmark():
    spec = importlib.util.spec_from_file_location(
        "model_card_benchmark", REPO / "benchmarks" / "model_card.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_encoder_page__shows_the_card_of_the_recorded_default_run():
    benchmark = _benchmark()
    card = benchmark.recorded_card()
    assert benchmark.page_card() == card, "rerun python benchmarks/model_card.py --checkpoint <default run>"
    # the record is the default job's run: its recipe, and every number the card states is the record's
    assert "model_kwargs:\n    embed_dim: 128\n    depth: 4" in card and "max_epochs: 30" in card
    assert "| 32x32 | 4 | 3 | 128 | 4 | 4 | 4 | 1e-06 |" in card
    assert "Trained for 30 epochs, 660 optimizer steps, 42,240 images seen" in card  # 660 x 64


@pytest.mark.parametrize(
    ("init_from", "init_format", "license"),
    [
        ("weights/mae_pretrain_vit_base.pth", "auto", OFFICIAL_LICENSE),
        ("facebook/vit-mae-base", "auto", OFFICIAL_LICENSE),
        ("checkpoint-799.pth", "official", OFFICIAL_LICENSE),
        ("runs/pretrain/version_0/checkpoints/last.ckpt", "auto", "other"),
        (None, "auto", "other"),
    ],
)
def test_card__licence_of_the_weights_the_run_started_from(init_from, init_format, license):
    config = dict(img_size=(32, 32), patch_size=4, in_chans=3, embed_dim=64, depth=2, num_heads=4)
    facts = RunFacts("x.ckpt", "lightning", {**config, "mlp_ratio": 4.0, "layer_norm_eps": 1e-6}, None)
    facts.hparams = {"init_from": init_from, "init_format": init_format}
    assert card_license(facts) == license
    card = model_card(facts, huggingface.CARD, "encoder_hf", has_decoder=False)
    assert f"license: {license}" in card
    assert ("CC BY-NC 4.0 (non-commercial use only)" in card) == (license == OFFICIAL_LICENSE)


@pytest.mark.parametrize(
    ("devices", "accelerator", "count"),
    [
        (2, "gpu", 2),
        ("2", "gpu", 2),  # --trainer.devices 2, as config.yaml stores it
        ([0, 1], "gpu", 2),
        ("0,1", "gpu", 2),
        ("1,", "gpu", 1),
        ("auto", "cpu", 1),
        ("auto", "gpu", None),
        ("auto", None, None),
        (-1, "gpu", None),
        ("-1", "gpu", None),
        (True, "gpu", None),
        ("two", "gpu", None),
    ],
)
def test_device_count__of_trainer_devices_as_config_yaml_stores_them(devices, accelerator, count):
    assert device_count(devices, accelerator) == count


def test_card__images_seen_with_devices_stored_as_text_and_unknown_for_auto():
    run = {"trainer": {"devices": "2", "num_nodes": 1}, "data": {"init_args": {"batch_size": 8}}}
    assert _images_seen(5, run) == 5 * 8 * 2
    run["trainer"] = {"devices": "auto", "accelerator": "gpu"}
    assert _images_seen(5, run) is None  # not stated rather than guessed


def test_card__finetuning_accuracies_logged_as_fractions_are_shown_in_percent(tmp_path):
    (tmp_path / "metrics.csv").write_text(
        "epoch,step,val/acc1,val/acc5,val/knn_acc1\n0,9,0.0009,0.5,\n1,19,0.125,0.75,\n1,19,,,42.5\n"
    )
    found = {e.name: (e.value, e.epochs) for e in _evaluations(tmp_path / "metrics.csv", {})}
    assert found == {
        "kNN top-1": (42.5, 2),  # the kNN monitor logs percent
        "fine-tuning top-1": (12.5, 2),
        "fine-tuning top-5": (75.0, 2),
    }


def test_card__names_the_target_of_the_run_and_of_a_run_before_0_5_0():
    def recipe(**hparams):
        facts = RunFacts("last.ckpt", "lightning", {}, None, {"mask_ratio": 0.75, "model": "m", **hparams})
        return "\n".join(_recipe(facts))

    assert "target `hog`, recipe model `m`" in recipe(target="hog")
    assert "target `norm_pix`" in recipe(norm_pix_loss=True)  # how 0.4.0 and earlier record it
    assert "target `pixel`" in recipe(norm_pix_loss=False)


def test_card__names_the_teacher_of_a_features_target_by_path_hash_and_block():
    teacher = {"path": "/runs/t/last.ckpt", "sha256": "ab" * 32, "format": "lightning", "embed_dim": 192}
    teacher |= {"depth": 12, "patch_size": 16, "num_heads": 3}
    options = {"dim": 192, "block": 8, "normalize": True, "teacher": teacher}
    config = dict(img_size=(32, 32), patch_size=4, in_chans=3, embed_dim=64, depth=2, num_heads=4)
    config |= {"mlp_ratio": 4.0, "layer_norm_eps": 1e-6, "target": "features", "target_options": options}
    facts = RunFacts("x.ckpt", "lightning", config, None)
    card = model_card(facts, huggingface.CARD, "encoder_hf", has_decoder=False)
    assert (
        f"Teacher (frozen, not part of these weights): `/runs/t/last.ckpt` (lightning, sha256 `{'ab' * 32}`"
        in card
    )
    assert "targets: the tokens of its block 8, normalised per token (LayerNorm without affine)." in card
    plain = model_card(
        RunFacts("x.ckpt", "lightning", {**config, "target_options": None}, None),
        huggingface.CARD,
        "e",
        has_decoder=False,
    )
    assert "Teacher" not in plain


def test_card__a_cnn_names_its_timm_model_mask_unit_decoder_and_papers_and_no_vit_words():
    from mae.convert.exports import timm as timm_target

    config = {
        "family": "cnn",
        "encoder": "resnet10t",
        "decoder": "spark",
        "img_size": (32, 32),
        "in_chans": 3,
    }
    config |= {"mask_unit": 8, "decoder_width": 64, "decoder_depth": 1, "target": "norm_pix"}
    facts = RunFacts("x.ckpt", "lightning", config, None, {"mask_ratio": 0.6, "model": "spark"})
    card = model_card(facts, timm_target.CARD, "resnet_timm", has_decoder=False)
    assert "timm's `resnet10t`" in card and "| 32x32 | `resnet10t` | 3 | 8 px | spark | 64 |" in card
    assert "SparK, Tian et al., 2023" in card and "@inproceedings{woo2023convnext" in card
    assert "Sparse masked pretraining of a CNN: mask ratio 0.6" in card and "convolutional-network" in card
    assert 'timm.create_model("local-dir:resnet_timm", pretrained=True)' in card
    for vit_word in ("Vision Transformer", "VisionTransformer", "vision-transformer", "ViTMAE", "cls token"):
        assert vit_word not in card, vit_word
