"""The model card: the encoder page shows the card of the recorded default run, regenerated here; the
licence of runs started from the official MAE weights."""

import importlib.util
from pathlib import Path

import pytest

from mae.convert.exports import huggingface
from mae.convert.model_card import OFFICIAL_LICENSE, RunFacts, card_license, model_card

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
