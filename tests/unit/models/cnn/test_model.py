"""``MaskedAutoencoderCNN``: the masking the ViT's, the encoder timm's own model, the loss on masked cells,
both decoders, and the settings it refuses."""

from copy import deepcopy

import pytest
import timm
import torch

from mae.errors import ConfigError
from mae.models import build_mae, build_model, create_model
from mae.models.cnn import CNN_DECODERS, MaskedAutoencoderCNN
from mae.models.loss import masked_patch_mse
from mae.models.targets.norm_pix import normalize_patches
from tests.helpers import TINY


def _tiny(decoder: str = "spark", encoder: str = "resnet10t", **kwargs) -> MaskedAutoencoderCNN:
    torch.manual_seed(0)
    defaults = dict(img_size=32, mask_unit=8, decoder_width=64)
    return MaskedAutoencoderCNN(encoder, decoder, **{**defaults, **kwargs})


def test_the_mask__is_the_vit_mae_mask_of_the_same_noise():
    # The same noise keeps the same cells as the ViT keeps patches: int(L * (1 - ratio)) smallest scores.
    cnn = _tiny()
    vit = build_mae(**{**TINY, "img_size": 32, "patch_size": 8})
    noise = torch.rand(3, 16, generator=torch.Generator().manual_seed(0))
    images = torch.randn(3, 3, 32, 32)
    _, _, vit_mask = vit(images, 0.6, noise)
    cnn_mask, visible = cnn.visible_cells(3, 0.6, noise, images.device)
    assert torch.equal(cnn_mask, vit_mask)
    assert torch.equal(visible.flatten(1), vit_mask == 0)
    assert int(cnn_mask.sum(1)[0]) == 16 - int(16 * 0.4)


@pytest.mark.parametrize("decoder", list(CNN_DECODERS))
def test_the_loss__is_the_norm_pix_mse_on_the_masked_cells_of_the_decoders_prediction(decoder):
    model = _tiny(decoder)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    noise = torch.rand(2, 16, generator=torch.Generator().manual_seed(2))
    loss, pred, mask = model(images, 0.6, noise)
    assert pred.shape == (2, 16, 8 * 8 * 3) and mask.shape == (2, 16)
    target = normalize_patches(model.patchify(images))
    per_cell = ((pred - target) ** 2).mean(-1)
    torch.testing.assert_close(loss, (per_cell * mask).sum() / mask.sum())
    torch.testing.assert_close(loss, masked_patch_mse(pred, model.patchify(images), mask, norm_pix_loss=True))
    loss.backward()
    assert model.encoder.conv1[0].weight.grad.abs().sum() > 0  # the encoder learns through the sparse ops


def test_the_state_dict__holds_the_timm_model_under_encoder_and_loads_into_it_strictly():
    model = _tiny("fcmae", encoder="convnextv2_atto")
    encoder = {k[len("encoder.") :]: v for k, v in model.state_dict().items() if k.startswith("encoder.")}
    plain = timm.create_model("convnextv2_atto", num_classes=0)
    plain.load_state_dict(encoder, strict=True)
    assert set(encoder) == set(plain.state_dict())
    # ConvNeXt's head norm is outside the maps: kept (timm loads it) but not trained (DDP waits for no grad).
    assert not model.encoder.head.norm.weight.requires_grad
    assert all(p.requires_grad for p in model.encoder.stages.parameters())


def test_the_config__rebuilds_the_same_architecture_and_the_named_models_take_the_papers_defaults():
    model = create_model("fcmae", encoder="convnextv2_atto", img_size=64, target="hog")
    rebuilt = build_model(**model.config)
    assert type(rebuilt) is MaskedAutoencoderCNN and rebuilt.config == model.config
    rebuilt.load_state_dict(model.state_dict(), strict=True)
    assert model.config["family"] == "cnn" and model.config["decoder_width"] == 512
    with torch.device("meta"):
        spark = create_model("spark")
    assert (spark.config["encoder"], spark.config["mask_unit"], spark.config["decoder_width"]) == (
        "resnet50",
        32,
        768,
    )


def test_fcmae__takes_any_target_and_spark__only_pixels():
    model = _tiny("fcmae", target="hog")
    _, pred, _ = model(torch.randn(2, 3, 32, 32), 0.5)
    assert pred.shape[-1] == model.target.dim == 2 * 2 * 3 * 9
    with pytest.raises(
        ConfigError, match="model.target hog is not pixels, and the spark decoder draws pixels"
    ):
        _tiny("spark", target="hog")


def test_grad_checkpointing__gives_the_gradients_of_the_plain_run():
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    noise = torch.rand(2, 16, generator=torch.Generator().manual_seed(4))
    grads = []
    for checkpointing in (False, True):
        model = _tiny("fcmae", encoder="convnextv2_atto")
        model.set_grad_checkpointing(checkpointing)
        model(images, 0.6, noise)[0].backward()
        grads.append(model.encoder.stages[0].blocks[0].conv_dw.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_after_a_masked_forward__the_encoder_called_directly_is_the_dense_timm_model():
    # Monitors, exports and the anomaly memory call the encoder itself: no mask of a past batch may remain.
    model = _tiny(encoder="resnet10t").eval()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    plain = timm.create_model("resnet10t", num_classes=0).eval()
    plain.load_state_dict(model.encoder.state_dict())
    with torch.no_grad():
        model(images, 0.6)
        assert model.mask_context.visible is None
        torch.testing.assert_close(model.encoder(images), plain(images), rtol=0, atol=0)


def test_a_deep_copy__computes_sparsely_on_its_own_mask_as_the_original_does():
    # An EMA copy of the model: its ops must read the copy's mask, not the original's (None outside it).
    model = _tiny("spark", encoder="resnet10t")
    copy = deepcopy(model)
    assert copy.encoder.conv1[0].mask_context is copy.mask_context is not model.mask_context
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    noise = torch.rand(2, 16, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(copy(images, 0.6, noise)[0], model(images, 0.6, noise)[0], rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mask_unit=12), "mask_unit 12 must divide resnet10t's largest stride 32"),
        (
            dict(img_size=48),
            "data.img_size 48x48 must be a positive multiple of resnet10t's largest stride 32",
        ),
        (dict(decoder="mae"), "model.model_kwargs.decoder must be one of spark, fcmae; got 'mae'"),
        (dict(encoder="resnet_9000"), "model.model_kwargs.encoder 'resnet_9000' is not a timm model name"),
        (dict(decoder_type="cross"), "model.decoder_type 'cross' is a switch of the ViT's decoder"),
        (dict(decoder_width=40), "decoder_width 40 must be divisible by 32"),
    ],
)
def test_settings_that_cannot_work__are_refused_naming_the_key(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        _tiny(**kwargs)


def test_mask_ratios__are_checked_on_the_mask_grid():
    model = _tiny()
    with pytest.raises(ValueError, match="mask"):
        model.check_mask_ratio(1.0)
    model.set_img_size(64)
    assert model.grid_size == (8, 8) and model.config["img_size"] == (32, 32)
