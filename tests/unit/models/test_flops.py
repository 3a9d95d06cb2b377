"""The analytic FLOP count of a training step (``mae.models.flops``): equal to torch's own count for
the paper's decoder and every variant, and smaller when a switch cuts decoding work."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mae.models.flops import mae_forward_flops, mae_train_flops, target_flops
from mae.training.runtime import set_attention_kernel
from tests.helpers import DECODER_VARIANTS as VARIANTS
from tests.helpers import tiny_mae


@pytest.mark.parametrize("kwargs", [{}, *VARIANTS.values()], ids=["paper", *VARIANTS])
def test_flops__analytic_count_equals_torch_flop_counter_in_a_training_step(kwargs):
    model = set_attention_kernel(tiny_mae(**kwargs).train(), "explicit")  # SDPA's CPU kernel is not counted
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(2, 3, 32, 32), 0.75)
    assert counter.get_total_flops() == 2 * mae_forward_flops(model, 0.75)


def test_flops__the_switches_cut_decoding_work():
    paper = mae_forward_flops(tiny_mae(), 0.75)
    counts = {name: mae_forward_flops(tiny_mae(**kw), 0.75) for name, kw in VARIANTS.items()}
    assert counts["cross_partial"] < counts["partial"] < paper and counts["cross"] < paper


def test_train_flops__forward_and_backward_are_three_forwards_per_image():
    model = tiny_mae()
    assert mae_train_flops(model, 8, 0.75) == 3 * 8 * mae_forward_flops(model, 0.75)
    assert mae_forward_flops(model, 0.5) > mae_forward_flops(model, 0.75)  # more visible tokens to encode


def test_flops__a_hog_models_patch_embedding_is_counted_on_its_pixels_not_its_target_width():
    model = set_attention_kernel(tiny_mae(target="hog").train(), "explicit")
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(2, 3, 32, 32), 0.75)
    assert counter.get_total_flops() == 2 * mae_forward_flops(model, 0.75)


def test_flops__a_features_step_counts_the_teachers_forward_up_to_its_block_once():
    from timm.models.vision_transformer import VisionTransformer

    teacher = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=24, depth=3, num_heads=2, dynamic_img_size=True
    )
    options = dict(dim=24, block=1, normalize=True)
    model = tiny_mae(target="features", target_options=options).train()
    model.target.set_teacher(set_attention_kernel(teacher, "explicit"), model.grid_size)
    set_attention_kernel(model, "explicit")
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(2, 3, 32, 32), 0.75)
    assert target_flops(model) > 0
    assert counter.get_total_flops() == 2 * (mae_forward_flops(model, 0.75) + target_flops(model))
    assert mae_train_flops(model, 8, 0.75) == 8 * (3 * mae_forward_flops(model, 0.75) + target_flops(model))
    assert target_flops(tiny_mae()) == 0
