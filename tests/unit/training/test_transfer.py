"""Where a transfer's encoder comes from (``mae.training.transfer.EncoderSource``): for a CNN, the timm
model itself, with the pretraining checkpoint's encoder weights or freshly initialised."""

import pytest
import timm
import torch

from mae.training.transfer import EncoderSource, encoder_record
from tests.helpers import untrained_cnn_checkpoint


def test_encoder_source__a_cnn_checkpoint_gives_the_timm_model_with_its_encoder_weights(tmp_path):
    checkpoint = untrained_cnn_checkpoint(tmp_path / "pre.ckpt", "resnet10t")
    # a ViT-only argument (the dense tasks': any input size) is left out for a CNN, which takes any size
    encoder, config, ckpt = EncoderSource(checkpoint=str(checkpoint)).build(32, 3, dynamic_img_size=True)
    assert type(encoder) is type(timm.create_model("resnet10t")) and ckpt.family == "cnn"
    saved = torch.load(checkpoint, weights_only=True)["state_dict"]
    expected = {k[len("model.encoder.") :]: v for k, v in saved.items() if k.startswith("model.encoder.")}
    assert encoder.state_dict().keys() == expected.keys()
    assert all(torch.equal(encoder.state_dict()[k], v) for k, v in expected.items())
    with pytest.raises(
        ValueError, match="model.global_pool 'token' pools a ViT's cls token; resnet10t is a CNN"
    ):
        EncoderSource(checkpoint=str(checkpoint)).build(32, 3, global_pool="token")


def test_encoder_source__a_cnn_model_without_checkpoint_is_the_timm_cnn_at_random_its_record_rebuilds_it():
    source = EncoderSource(
        model="fcmae", model_kwargs=dict(encoder="convnextv2_atto", mask_unit=8, decoder_width=64)
    )
    torch.manual_seed(0)
    encoder, config, ckpt = source.build(32, 1, num_classes=4, drop_path_rate=0.1)
    assert ckpt is None and config["encoder"] == "convnextv2_atto"
    reference = timm.create_model("convnextv2_atto", num_classes=4, in_chans=1)
    assert {k: v.shape for k, v in encoder.state_dict().items()} == {
        k: v.shape for k, v in reference.state_dict().items()
    }
    assert encoder.stages[3].blocks[1].drop_path.drop_prob > 0  # drop path reaches timm
    record = encoder_record(config, 1)
    rebuilt, _, _ = EncoderSource(model="not read").build(32, 1, record=record, num_classes=4)
    rebuilt.load_state_dict(encoder.state_dict(), strict=True)
