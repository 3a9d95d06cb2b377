"""The encoder as a detection backbone: ViTDet's simple feature pyramid, taken by torchvision's
detectors as it is."""

import copy

import pytest
import torch
from torchvision.models.detection import FasterRCNN, MaskRCNN, RetinaNet

from mae.convert.backbone import build_vit, load_backbone
from mae.dense.models.pyramid import FEATURE_NAMES, SimpleFeaturePyramid, feature_pyramid
from mae.errors import ConfigError
from mae.models import create_model
from tests.helpers import (
    TINY_KWARGS,
    LabelledImages,
    finetune_module,
    make_trainer,
    tiny_pretraining_checkpoint,
)


def _vit(depth: int = 1):
    config = create_model("mae_vit_tiny_patch4", img_size=16, **{**TINY_KWARGS, "depth": depth}).config
    return build_vit(config, img_size=16, dynamic_img_size=True)


def test_pyramid__five_maps_at_vitdet_strides_for_any_input_size():
    torch.manual_seed(0)
    pyramid = SimpleFeaturePyramid(_vit(), out_channels=24)
    maps = pyramid(torch.randn(2, 3, 30, 45))  # neither square nor a multiple of the 4 px patch
    assert list(maps) == list(FEATURE_NAMES) and pyramid.out_channels == 24
    assert pyramid.strides == (1.0, 2.0, 4.0, 8.0, 16.0)  # p/4, p/2, p, 2p, 4p for p = 4
    padded = (32, 48)  # padded at the right and bottom to the patch grid: 8 x 12 patches
    for (name, m), stride in zip(maps.items(), pyramid.strides, strict=True):
        assert m.shape[:2] == (2, 24), name
        assert m.shape[2:] == (int(padded[0] // stride), int(padded[1] // stride)), name


def test_pyramid__an_intermediate_block_feeds_it_and_bad_settings_are_named():
    torch.manual_seed(0)
    vit = _vit(depth=2)
    torch.manual_seed(0)
    last = SimpleFeaturePyramid(copy.deepcopy(vit), out_channels=8)
    torch.manual_seed(0)
    first = SimpleFeaturePyramid(copy.deepcopy(vit), out_channels=8, block=0)
    assert len(first.vit.blocks) == 1 and len(last.vit.blocks) == 2  # blocks after the one used are dropped
    images = torch.randn(1, 3, 16, 16)
    assert not torch.allclose(first(images)["2"], last(images)["2"])  # same heads, other block
    maps = last(images)
    sum(m.sum() for m in maps.values()).backward()
    unused = [name for name, p in last.named_parameters() if p.grad is None]
    assert unused == []  # DDP needs a gradient for every parameter (the left-out cls token's is zero)
    with pytest.raises(
        ValueError, match=r"4x3 px are too small for the feature pyramid: .* \(at least 5x5 px\)"
    ):
        last(torch.randn(1, 3, 4, 3))
    with pytest.raises(ValueError, match="pyramid block 5 is not one of the encoder's 2 blocks"):
        SimpleFeaturePyramid(vit, block=5)
    config = create_model("mae_vit_tiny_patch4", img_size=16, **TINY_KWARGS).config
    with pytest.raises(ValueError, match="dynamic_img_size=True"):
        SimpleFeaturePyramid(build_vit(config, img_size=16))


def test_pyramid__grad_checkpointing_gives_the_same_maps_and_gradients():
    images = torch.randn(2, 3, 24, 20)
    results = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        pyramid = SimpleFeaturePyramid(_vit(depth=2), out_channels=8, grad_checkpointing=checkpointing)
        calls, mlp = [], pyramid.vit.blocks[0].mlp
        mlp.forward = lambda x, f=mlp.forward, c=calls: (c.append(1), f(x))[1]  # (hooks skip recomputation)
        maps = pyramid(images)
        sum(m.square().mean() for m in maps.values()).backward()
        assert len(calls) == (2 if checkpointing else 1)  # recomputed in the backward pass
        results.append((maps["0"].detach(), pyramid.vit.blocks[0].attn.qkv.weight.grad))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


def test_pyramid__the_name_before_0_4_0_is_refused_naming_grad_checkpointing(tmp_path):
    renamed = r"^model.activation_checkpointing was moved to model.grad_checkpointing in 0.4.0"
    with pytest.raises(ConfigError, match=renamed):
        SimpleFeaturePyramid(_vit(), activation_checkpointing=True)
    with pytest.raises(ConfigError, match=renamed):  # routed to the pyramid, not to load_backbone
        feature_pyramid(tiny_pretraining_checkpoint(tmp_path), activation_checkpointing=True)
    with pytest.raises(TypeError, match="unexpected keyword arguments: checkpointing"):
        SimpleFeaturePyramid(_vit(), checkpointing=True)


def test_pyramid__from_a_pretraining_checkpoint_holds_its_encoder(tmp_path):
    checkpoint = tiny_pretraining_checkpoint(tmp_path)
    pyramid = feature_pyramid(checkpoint, out_channels=16)
    reference = load_backbone(checkpoint)
    kept = pyramid.vit.state_dict()
    assert set(reference.state_dict()) - set(kept) == {"norm.weight", "norm.bias"}  # ViTDet has no final norm
    for name, value in kept.items():
        torch.testing.assert_close(value, reference.state_dict()[name], rtol=0, atol=0)
    assert pyramid(torch.randn(1, 3, 64, 80))["pool"].shape == (1, 16, 4, 5)  # 4x the 16 px pretraining size


def test_pyramid__from_a_classifier_finetuned_with_average_pooling(tmp_path):
    # such a checkpoint has an fc_norm and no final norm; the pyramid keeps neither,
    # so it loads all the blocks
    module = finetune_module(
        encoder=dict(checkpoint=str(tiny_pretraining_checkpoint(tmp_path))), global_pool="avg"
    )
    trainer = make_trainer(tmp_path, max_steps=2, limit_val_batches=0)
    trainer.fit(module, datamodule=LabelledImages())
    checkpoint = tmp_path / "finetuned.ckpt"
    trainer.save_checkpoint(checkpoint)
    pyramid = feature_pyramid(checkpoint, out_channels=16)
    finetuned = module.vit.state_dict()
    for name, value in pyramid.vit.state_dict().items():
        torch.testing.assert_close(value, finetuned[name], rtol=0, atol=0)
    assert not hasattr(pyramid.vit.norm, "weight") and not hasattr(pyramid.vit.fc_norm, "weight")
    # token features need the final norm it lacks: refused with the pooling that fits, which loads
    with pytest.raises(
        ValueError, match=r"finetuned.ckpt is an encoder fine-tuned with global average.*'avg'"
    ):
        load_backbone(checkpoint)
    torch.testing.assert_close(
        load_backbone(checkpoint, global_pool="avg").fc_norm.weight, module.vit.fc_norm.weight
    )


def _scenes(count: int, size: int = 64) -> tuple[list[torch.Tensor], list[dict]]:
    """Bright squares on noise: one box (and its mask) of class 1 or 2 per image."""
    generator = torch.Generator().manual_seed(0)
    images, targets = [], []
    for i in range(count):
        image = torch.rand(3, size, size, generator=generator) * 0.2
        x0, y0 = 8 + 6 * i, 10 + 4 * i
        image[:, y0 : y0 + 24, x0 : x0 + 20] = 0.9
        mask = torch.zeros(1, size, size, dtype=torch.uint8)
        mask[:, y0 : y0 + 24, x0 : x0 + 20] = 1
        boxes = torch.tensor([[x0, y0, x0 + 20, y0 + 24]], dtype=torch.float32)
        targets.append({"boxes": boxes, "labels": torch.tensor([1 + i % 2]), "masks": mask})
        images.append(image)
    return images, targets


@pytest.mark.parametrize("detector", [FasterRCNN, MaskRCNN, RetinaNet])
def test_detectors__take_the_pyramid_as_backbone_and_train(detector):
    torch.manual_seed(0)
    sizes = dict(min_size=64, max_size=64)  # small images: the test runs in seconds on a CPU
    model = detector(SimpleFeaturePyramid(_vit(), out_channels=32), num_classes=3, **sizes)
    images, targets = _scenes(2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    losses = []
    for _ in range(6):
        loss = sum(model(images, targets).values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    model.eval()
    with torch.no_grad():
        (prediction,) = model(images[:1])
    assert {"boxes", "scores", "labels"} <= set(prediction)


def test_window_attention__equals_global_attention_when_one_window_covers_the_grid():
    torch.manual_seed(0)
    vit = _vit(depth=2)
    pyramid = SimpleFeaturePyramid(vit, out_channels=8)
    images = torch.randn(2, 3, 28, 20)  # a 7 x 5 patch grid
    expected = pyramid.encode(pyramid.pad(images))
    for window in (7, 9):  # exactly the grid; larger, so the window is padded (padding masked out)
        pyramid.window_size, pyramid.global_blocks = window, ()
        torch.testing.assert_close(pyramid.encode(pyramid.pad(images)), expected)


def test_window_attention__each_window_attends_only_to_itself():
    torch.manual_seed(0)
    vit = _vit(depth=1)
    pyramid = SimpleFeaturePyramid(vit, out_channels=8, window_size=3, global_blocks=())
    images = torch.randn(1, 3, 20, 28)  # 5 x 7 patches: windows of 3 x 3, the last row and column padded
    (features,) = pyramid.encode(images).values()  # (1, D, 5, 7)
    # An independent reference: the block run on one window's tokens alone, no padding anywhere.
    tokens = vit._pos_embed(vit.patch_embed(images))[:, 1:].reshape(1, 5, 7, -1)
    for rows, cols in ((slice(0, 3), slice(0, 3)), (slice(3, 5), slice(6, 7)), (slice(3, 5), slice(3, 6))):
        window = tokens[:, rows, cols]
        alone = vit.blocks[0](window.reshape(1, -1, window.shape[-1])).reshape(window.shape)
        torch.testing.assert_close(features[:, :, rows, cols].permute(0, 2, 3, 1), alone)
    # The default global blocks are ViTDet's: the last of each quarter.
    assert SimpleFeaturePyramid(_vit(depth=2), window_size=4).global_blocks == (0, 1)
    from mae.dense.models.windows import default_global_blocks

    assert default_global_blocks(12) == (2, 5, 8, 11) and default_global_blocks(24) == (5, 11, 17, 23)


def _attend_with_bias(block, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A timm ``Block`` on (1, L, D) tokens written out, with (heads, L, L) added to its attention logits."""
    attn = block.attn
    n, length, dim = x.shape
    q, k, v = attn.qkv(block.norm1(x)).reshape(n, length, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    logits = q @ k.transpose(-2, -1) * attn.head_dim**-0.5 + bias
    x = x + attn.proj((logits.softmax(-1) @ v).transpose(1, 2).reshape(n, length, dim))
    return x + block.mlp(block.norm2(x))


def test_window_relative_position__zero_at_start_then_an_offset_bias_inside_each_window():
    torch.manual_seed(0)
    vit = _vit(depth=2)
    plain = SimpleFeaturePyramid(copy.deepcopy(vit), out_channels=8, window_size=3, global_blocks=(1,))
    relative = SimpleFeaturePyramid(
        vit, out_channels=8, window_size=3, global_blocks=(1,), relative_position=True
    )
    assert not hasattr(relative.vit.blocks[1], "window_position_bias")  # global blocks have none
    images = torch.randn(1, 3, 20, 28)  # 5 x 7 patches: windows of 3 x 3, the last row and column padded
    torch.testing.assert_close(relative.encode(images), plain.encode(images))  # zero-initialised: no change

    table = relative.vit.blocks[0].window_position_bias.relative_position_bias_table  # (5 * 5 offsets, heads)
    with torch.no_grad():
        table.normal_()
    relative.vit.blocks = relative.vit.blocks[:1]
    relative.blocks = (0,) * 4
    (features,) = relative.encode(images).values()  # (1, D, 5, 7)
    tokens = vit._pos_embed(vit.patch_embed(images))[:, 1:].reshape(1, 5, 7, -1)

    def offset_bias(rows: range, cols: range) -> torch.Tensor:
        """(heads, L, L): the table's entry for each pair's (row, column) offset, Swin's index order."""
        cells = [(r, c) for r in rows for c in cols]
        index = torch.tensor([[(ri - rj + 2) * 5 + (ci - cj + 2) for rj, cj in cells] for ri, ci in cells])
        return table[index].permute(2, 0, 1)

    # An independent reference per window: the block written out on that window's real tokens alone.
    for rows, cols in ((range(0, 3), range(0, 3)), (range(3, 5), range(6, 7)), (range(3, 5), range(3, 6))):
        window = tokens[:, rows.start : rows.stop, cols.start : cols.stop]
        local = range(len(rows)), range(len(cols))
        alone = _attend_with_bias(
            relative.vit.blocks[0], window.reshape(1, -1, window.shape[-1]), offset_bias(*local)
        )
        got = features[:, :, rows.start : rows.stop, cols.start : cols.stop].permute(0, 2, 3, 1)
        torch.testing.assert_close(got, alone.reshape(window.shape))
    expected = relative(images)[FEATURE_NAMES[0]]
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the float32 bias beside a bfloat16 attention
        got = relative(images)[FEATURE_NAMES[0]]
    torch.testing.assert_close(got.float(), expected, atol=0.1, rtol=0.1)


def test_window_relative_position__needs_windows_and_decays_with_its_block():
    from mae.dense.tasks.base import layer_decay_groups

    with pytest.raises(
        ValueError, match="relative_position is a bias inside attention windows: set window_size"
    ):
        SimpleFeaturePyramid(_vit(), relative_position=True)
    pyramid = SimpleFeaturePyramid(
        _vit(depth=2), out_channels=8, window_size=2, global_blocks=(), relative_position=True
    )
    groups = layer_decay_groups(pyramid, pyramid.vit, weight_decay=0.05, layer_decay=0.5)
    scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    for block in pyramid.vit.blocks:
        assert (
            scale[id(block.window_position_bias.relative_position_bias_table)]
            == scale[id(block.attn.qkv.weight)]
        )
    assert scale[id(pyramid.vit.blocks[0].attn.qkv.weight)] < scale[id(pyramid.vit.blocks[1].attn.qkv.weight)]


def test_pyramid__four_blocks_feed_four_scales_and_window_settings_are_checked():
    torch.manual_seed(0)
    vit = _vit(depth=4)
    pyramid = SimpleFeaturePyramid(vit, out_channels=8, block=(0, 1, 2, 3))
    maps = pyramid(torch.randn(1, 3, 16, 16))
    assert [tuple(m.shape[2:]) for m in maps.values()] == [(16, 16), (8, 8), (4, 4), (2, 2), (1, 1)]
    coarse = SimpleFeaturePyramid(_vit(depth=1), out_channels=8, scales=(2, 1, 0.5, 0.25))
    maps = coarse(torch.randn(1, 3, 16, 16))
    assert [tuple(m.shape[2:]) for m in maps.values()] == [(8, 8), (4, 4), (2, 2), (1, 1), (1, 1)]
    assert coarse.strides == (2.0, 4.0, 8.0, 16.0, 32.0)
    with pytest.raises(ValueError, match=r"needs 4 patches of 4x4 px along each side \(at least 13x13 px\)"):
        coarse(torch.randn(1, 3, 12, 16))
    with pytest.raises(ValueError, match="4 scales from the finest down"):
        SimpleFeaturePyramid(_vit(depth=1), scales=(1, 2, 0.5, 0.25))
    with pytest.raises(ValueError, match="one block or 4"):
        SimpleFeaturePyramid(vit, block=(0, 1))
    with pytest.raises(ValueError, match="global block 7 is not one of the encoder's 4 blocks"):
        SimpleFeaturePyramid(vit, window_size=2, global_blocks=(7,))
    with pytest.raises(ValueError, match="global_blocks only applies with window attention"):
        SimpleFeaturePyramid(vit, global_blocks=(1,))
    with pytest.raises(ValueError, match="window_size must be a positive"):
        SimpleFeaturePyramid(vit, window_size=0)


def test_readme_detector__sized_for_the_encoder_and_torchvisions_800_px_refused_by_name(tmp_path):
    """README's one-line use: torchvision's default resize (800 px) made a 64 px scene 40,000 tokens of a
    4-px-patch encoder, and 23.6 GB in three steps. The pyramid refuses that input before encoding it;
    ``detector_sizes()`` gives the detector the encoder's pretraining size, and it trains."""
    backbone = feature_pyramid(tiny_pretraining_checkpoint(tmp_path), out_channels=16)
    assert backbone.detector_sizes() == {"min_size": 16, "max_size": 16}
    images = [torch.rand(3, 64, 64)]
    targets = [
        {
            "boxes": torch.tensor([[8.0, 8.0, 40.0, 40.0]]),
            "labels": torch.tensor([3]),
            "masks": torch.zeros(1, 64, 64, dtype=torch.uint8),
        }
    ]
    with pytest.raises(
        ValueError, match=r"images of 800x800 px make 40,000 patches, over this pyramid's max_tokens"
    ):
        MaskRCNN(backbone, num_classes=11)(images, targets)
    detector = MaskRCNN(backbone, num_classes=11, **backbone.detector_sizes())
    losses = detector(images, targets)
    sum(losses.values()).backward()
    assert all(torch.isfinite(v) for v in losses.values())
