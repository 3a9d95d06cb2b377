"""The sparse property of masked dense convolution (``mae.models.cnn.sparse``), against independent
references: the plain timm model on a cell cropped out of the image (what a submanifold sparse network
computes for a cell with no visible neighbour), ``F.batch_norm`` over the visible positions gathered by hand,
and the timm model itself with nothing masked."""

import pytest
import timm
import torch
import torch.nn.functional as F
from torch import nn

from mae.errors import ConfigError
from mae.models.cnn import MaskedAutoencoderCNN
from mae.models.cnn.sparse import MaskContext, SparseBatchNorm2d, resize_mask

# A BatchNorm ResNet and a LayerNorm + GRN ConvNeXt-V2, small; 64 px: a 2x2 grid of 32-px cells.
ENCODERS = ["resnet10t", "convnextv2_atto"]


def _model(encoder: str, **kwargs) -> MaskedAutoencoderCNN:
    torch.manual_seed(0)
    defaults = dict(decoder="fcmae", img_size=64, decoder_width=32)
    return MaskedAutoencoderCNN(encoder, **{**defaults, **kwargs})


def _randomise_norms(model: nn.Module) -> None:
    """Running statistics and affine weights away from their identity init, so a norm that reads the wrong
    positions cannot hide behind zero means and unit scales."""
    generator = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.copy_(torch.randn(module.num_features, generator=generator) * 0.1)
            module.running_var.copy_(torch.rand(module.num_features, generator=generator) + 0.5)
        if isinstance(module, nn.BatchNorm2d | nn.LayerNorm) or type(module).__name__ == "GlobalResponseNorm":
            with torch.no_grad():
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.2 + 1)
                module.bias.copy_(torch.randn(module.bias.shape, generator=generator) * 0.2)


@pytest.mark.parametrize("encoder", ENCODERS)
def test_a_lone_visible_cell__is_encoded_as_the_timm_model_encodes_that_cell_cropped_out(encoder):
    # Submanifold sparse convolution reads no masked position: a visible cell whose neighbours are all
    # masked is computed as if the image were that cell alone, zero-padded, which the plain timm model
    # computes on the crop. Any masked position left non-zero after an op (no re-masking) leaks into it.
    model = _model(encoder, img_size=96).eval()  # eval: BatchNorm is per position, as on the crop
    with torch.no_grad():
        _randomise_norms(model)
    plain = timm.create_model(encoder, num_classes=0).eval()
    plain.load_state_dict(model.encoder.state_dict())
    images = torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(2))
    visible = torch.zeros(2, 1, 3, 3, dtype=torch.bool)
    visible[:, :, 1, 1] = True  # the centre cell, masked neighbours on every side
    with torch.no_grad():
        maps = model.forward_encoder(images, visible)
        crops = plain.forward_intermediates(images[:, :, 32:64, 32:64], intermediates_only=True)
    for sparse, crop in zip(maps, crops, strict=True):
        side = sparse.shape[-1] // 3
        cell = sparse[:, :, side : 2 * side, side : 2 * side]
        torch.testing.assert_close(cell, crop, rtol=1e-5, atol=1e-5)
        outside = sparse * ~resize_mask(visible, sparse.shape[-2:])
        assert outside.abs().max() == 0, "masked positions must stay exactly zero"


@pytest.mark.parametrize("encoder", ENCODERS)
def test_pixels_under_masked_cells__change_no_visible_feature_bit_for_bit_in_training_mode(encoder):
    model = _model(encoder).train()
    images = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    noise = torch.rand(4, 4, generator=torch.Generator().manual_seed(4))
    mask, visible = model.visible_cells(4, 0.5, noise, images.device)
    changed = images + 5 * torch.randn_like(images) * (1 - resize_mask(visible, (64, 64)).float())
    with torch.no_grad():
        first = model.forward_encoder(images, visible)
        second = model.forward_encoder(changed, visible)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(images, changed)


def test_sparse_batch_norm__statistics_and_running_estimates_are_those_of_the_visible_positions_alone():
    context = MaskContext()
    norm = SparseBatchNorm2d(6, momentum=0.3)
    norm.mask_context = context
    reference = nn.BatchNorm2d(6, momentum=0.3)
    with torch.no_grad():
        for module in (norm, reference):
            module.weight.copy_(torch.linspace(0.5, 1.5, 6))
            module.bias.copy_(torch.linspace(-1, 1, 6))
    x = torch.randn(3, 6, 8, 8, generator=torch.Generator().manual_seed(5)) + 2.0
    visible = torch.rand(3, 1, 4, 4, generator=torch.Generator().manual_seed(6)) < 0.4
    context.set(visible)
    zeroed = x * resize_mask(visible, (8, 8))
    out = norm(zeroed)

    kept = resize_mask(visible, (8, 8))[:, 0]  # (N, H, W)
    gathered = x.permute(0, 2, 3, 1)[kept]  # (K, C): the visible positions only
    expected = F.batch_norm(
        gathered,
        reference.running_mean,
        reference.running_var,
        reference.weight,
        reference.bias,
        training=True,
        momentum=0.3,
        eps=reference.eps,
    )
    torch.testing.assert_close(out.permute(0, 2, 3, 1)[kept], expected, rtol=1e-5, atol=1e-5)
    assert out.permute(0, 2, 3, 1)[~kept].abs().max() == 0
    torch.testing.assert_close(norm.running_mean, reference.running_mean)
    torch.testing.assert_close(norm.running_var, reference.running_var)
    # A dense BatchNorm counts the masked zeros, and its mean is pulled towards 0.
    dense = nn.BatchNorm2d(6, momentum=0.3)
    dense(zeroed)
    assert (norm.running_mean - dense.running_mean).abs().min() > 0.2


@pytest.mark.parametrize("encoder", ENCODERS)
def test_with_nothing_masked__the_encoder_is_the_plain_timm_model(encoder):
    model = _model(encoder).train()
    plain = timm.create_model(encoder, num_classes=0).train()
    plain.load_state_dict(model.encoder.state_dict())  # the same keys: strict
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(7))
    everything = torch.ones(2, 1, 2, 2, dtype=torch.bool)
    with torch.no_grad():
        dense = model.forward_encoder(images, None)
        all_visible = model.forward_encoder(images, everything)
        reference = plain.forward_intermediates(images, intermediates_only=True)
    for a, b, c in zip(dense, all_visible, reference, strict=True):
        assert torch.equal(a, c)  # no mask: the timm model's own ops
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-5)  # BatchNorm over (K, C): another kernel


@pytest.mark.parametrize(
    "encoder, part",
    [("seresnet18", "SEModule"), ("resnet50_gn", "GroupNorm")],
)
def test_an_encoder_with_ops_that_mix_positions__is_refused_naming_the_op(encoder, part):
    with pytest.raises(ConfigError, match=f"model.model_kwargs.encoder {encoder}: its .*({part})"):
        _model(encoder)


def test_resize_mask__repeats_onto_finer_maps_and_keeps_a_coarse_position_when_any_cell_is_visible():
    visible = torch.tensor([[[[True, False], [False, False]]]])
    assert resize_mask(visible, (4, 4))[0, 0].tolist() == [[True, True, False, False]] * 2 + [[False] * 4] * 2
    assert resize_mask(visible, (1, 1)).flatten().tolist() == [True]
    with pytest.raises(ConfigError, match="does not tile the 2x2 mask grid"):
        resize_mask(visible, (3, 3))
