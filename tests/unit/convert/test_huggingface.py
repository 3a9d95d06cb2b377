"""Parity with an independent implementation: Hugging Face transformers' ViTMAEForPreTraining."""

import pytest
import torch

from mae.convert.huggingface import from_hf_state_dict, save_hf_pretrained, to_hf_state_dict
from mae.models import MaskedAutoencoderViT
from tests.helpers import TINY

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("norm_pix_loss", [False, True])
@pytest.mark.parametrize("mask_ratio", [0.75, 0.5])
def test_hf_vitmae__same_loss_logits_and_mask(tmp_path, norm_pix_loss, mask_ratio):
    torch.manual_seed(0)
    ours = MaskedAutoencoderViT(**TINY, norm_pix_loss=norm_pix_loss).eval()
    save_hf_pretrained(ours, tmp_path, mask_ratio=mask_ratio)
    hf = transformers.ViTMAEForPreTraining.from_pretrained(tmp_path).eval()
    assert hf.config.layer_norm_eps == 1e-6

    imgs = torch.randn(3, 3, 32, 32)
    noise = torch.rand(3, 64)
    with torch.no_grad():
        loss, pred, mask = ours(imgs, mask_ratio, noise)
        out = hf(pixel_values=imgs, noise=noise)
    torch.testing.assert_close(mask, out.mask)
    torch.testing.assert_close(pred, out.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, out.loss, rtol=1e-5, atol=1e-6)


def test_hf_state_dict__roundtrip_through_transformers(tmp_path):
    torch.manual_seed(0)
    ours = MaskedAutoencoderViT(**TINY)
    save_hf_pretrained(ours, tmp_path)
    hf = transformers.ViTMAEForPreTraining.from_pretrained(tmp_path)
    back = from_hf_state_dict(hf.state_dict())  # the installed release's own layout
    reloaded = MaskedAutoencoderViT(**TINY)
    reloaded.load_state_dict(back, strict=True)
    for key, value in ours.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[key], value, rtol=0, atol=0)
    # and the hub layout maps back too
    assert set(from_hf_state_dict(to_hf_state_dict(ours.state_dict()))) == set(ours.state_dict())


def test_hf_state_dict__qkv_split_in_query_key_value_order():
    ours = MaskedAutoencoderViT(**TINY)
    hf = to_hf_state_dict(ours.state_dict())
    qkv = ours.blocks[1].attn.qkv.weight
    torch.testing.assert_close(hf["vit.encoder.layer.1.attention.attention.key.weight"], qkv[64:128])


def test_from_hf_state_dict__unknown_key_is_named():
    with pytest.raises(KeyError, match="vit.pooler.dense.weight"):
        from_hf_state_dict({"vit.pooler.dense.weight": torch.zeros(2, 2)})


def test_hf_config__a_hog_decoder_is_refused_its_encoder_is_exported():
    from mae.convert.huggingface import hf_config_of
    from mae.errors import ConfigError

    config = MaskedAutoencoderViT(**TINY, target="hog").config
    with pytest.raises(ConfigError, match="decoder predicts pixels, but this model's predicts target 'hog'"):
        hf_config_of(config, decoder=True)
    assert hf_config_of(config, decoder=False)["norm_pix_loss"] is False
    assert hf_config_of(MaskedAutoencoderViT(**TINY, target="norm_pix").config, decoder=True)["norm_pix_loss"]
