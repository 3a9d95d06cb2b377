"""TinyMIM's relation targets (``mae.models.relations``) against independent computations: timm's own
attention probabilities (``fused_attn=False``) for softmax(Q Kᵀ/√d), a loop over tokens for
softmax(V Vᵀ/√d), a timm block built with the teacher's head count for the head split, and
``torch.nn.functional.kl_div`` for the loss."""

import math

import pytest
import timm
import torch
from timm.models.vision_transformer import Block
from torch.nn import functional as F

from mae.errors import ConfigError
from mae.models.relations import (
    Relations,
    block_index,
    block_relations,
    kl_divergence,
    regroup_heads,
    relation_loss,
)


def _vit(seed: int = 0, **kwargs) -> torch.nn.Module:
    torch.manual_seed(seed)
    args = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=0)
    return timm.create_model("vit_tiny_patch16_224", **{**args, **kwargs}).eval()


def _attention_probabilities(block: Block, run) -> torch.Tensor:
    """timm's own softmax(Q Kᵀ · scale) of ``block`` (its explicit path), while ``run()`` runs the model."""
    block.attn.fused_attn = False
    seen = {}
    hook = block.attn.attn_drop.register_forward_hook(lambda m, i, o: seen.setdefault("p", o))
    try:
        run()
    finally:
        hook.remove()
    return seen["p"]


def _block_input(vit, imgs: torch.Tensor, index: int) -> torch.Tensor:
    seen = {}
    hook = vit.blocks[index].register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0]))
    vit(imgs)
    hook.remove()
    return seen["x"]


def test_block_relations__query_key_relation_is_timms_attention():
    vit, imgs = _vit(), torch.randn(3, 3, 16, 16)
    for block in (0, 1, -1):
        relations = block_relations(vit, imgs, block)
        expected = _attention_probabilities(vit.blocks[block], lambda: vit(imgs))
        assert relations.qk.shape == (3, 2, 17, 17)  # cls + 16 patches: every token, cls included
        torch.testing.assert_close(relations.qk.exp(), expected, atol=1e-6, rtol=1e-5)


def test_block_relations__value_relation_as_a_loop_over_tokens():
    vit, imgs = _vit(), torch.randn(2, 3, 16, 16)
    block = vit.blocks[1]
    x = block.norm1(_block_input(vit, imgs, 1))
    v = x @ block.attn.qkv.weight[64:].T + block.attn.qkv.bias[64:]  # (N, T, 32): the values' rows
    relations = block_relations(vit, imgs, 1)
    for n in range(2):
        for head in range(2):
            values = v[n, :, head * 16 : (head + 1) * 16]
            for i in range(17):
                logits = torch.stack([values[i] @ values[j] / math.sqrt(16) for j in range(17)])
                torch.testing.assert_close(
                    relations.vv[n, head, i], logits.log_softmax(0), atol=1e-5, rtol=1e-5
                )


def test_block_relations__teacher_head_count_is_a_block_built_with_those_heads():
    """TinyMIM gives the student's last block the teacher's heads: the same qkv weights in a timm block of 8
    heads give the relations of our split into 8 heads (head width 32 / 8 = 4, the √d of the scale)."""
    vit, imgs = _vit(), torch.randn(2, 3, 16, 16)
    relations = block_relations(vit, imgs, -1, heads=8)
    assert relations.qk.shape == (2, 8, 17, 17)
    eight = Block(32, 8, qkv_bias=True, norm_layer=vit.blocks[-1].norm1.__class__).eval()
    eight.load_state_dict(vit.blocks[-1].state_dict())
    x = _block_input(vit, imgs, 1)
    expected = _attention_probabilities(eight, lambda: eight(x))
    torch.testing.assert_close(relations.qk.exp(), expected, atol=1e-6, rtol=1e-5)


def test_block_relations__qk_norm_is_applied_in_the_blocks_own_heads():
    vit, imgs = _vit(qk_norm=True), torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        for norm in (vit.blocks[-1].attn.q_norm, vit.blocks[-1].attn.k_norm):
            norm.weight.uniform_(0.5, 2.0)
    expected = _attention_probabilities(vit.blocks[-1], lambda: vit(imgs))
    torch.testing.assert_close(block_relations(vit, imgs, -1).qk.exp(), expected, atol=1e-6, rtol=1e-5)


def test_regroup_heads__concatenates_the_heads_then_splits_them():
    x = torch.arange(2 * 2 * 3 * 4, dtype=torch.float32).reshape(2, 2, 3, 4)  # (N, 2 heads, T, 4)
    four = regroup_heads(x, 4)
    assert four.shape == (2, 4, 3, 2)
    torch.testing.assert_close(four[:, 2], x[:, 1, :, :2])  # head 2 of 4 is the first half of head 1 of 2
    torch.testing.assert_close(regroup_heads(four, 2), x)


def test_kl_divergence__is_torchs_kl_div_summed_over_keys_averaged_over_the_rest():
    torch.manual_seed(0)
    teacher = torch.randn(2, 3, 5, 7).log_softmax(-1)
    student = torch.randn(2, 3, 5, 7).log_softmax(-1)
    expected = F.kl_div(student, teacher.exp(), reduction="none").sum(-1).mean()
    torch.testing.assert_close(kl_divergence(teacher, student), expected)
    hand = (teacher.exp() * (teacher - student)).sum(-1).mean()
    torch.testing.assert_close(kl_divergence(teacher, student), hand)
    # A teacher probability of exactly 0 adds nothing (0 log 0 = 0), not NaN.
    zero = torch.tensor([[0.0, 0.5, 0.5]]).log()
    assert kl_divergence(zero, torch.full((1, 3), 1 / 3).log()).item() == pytest.approx(math.log(2 / 3) * -1)


def test_relation_loss__zero_for_a_student_identical_to_the_teacher_positive_otherwise():
    teacher, imgs = _vit(seed=0), torch.randn(2, 3, 16, 16)
    same = block_relations(_vit(seed=0), imgs, -1, heads=4)
    loss = relation_loss(same, block_relations(teacher, imgs, -1, heads=4))
    assert loss.total.item() == 0.0 and loss.qk.item() == 0.0 and loss.vv.item() == 0.0
    other = relation_loss(
        block_relations(_vit(seed=1), imgs, -1, heads=4), block_relations(teacher, imgs, -1, 4)
    )
    assert other.qk.item() > 0 and other.vv.item() > 0
    torch.testing.assert_close(other.total, other.qk + other.vv)


def test_relation_loss__gradients_reach_the_student_up_to_its_qkv():
    student, imgs = _vit(seed=1), torch.randn(2, 3, 16, 16)
    target = block_relations(_vit(seed=0), imgs, -1, heads=4)
    relation_loss(block_relations(student, imgs, -1, heads=4), target).total.backward()
    assert student.blocks[-1].attn.qkv.weight.grad.abs().sum() > 0
    assert student.patch_embed.proj.weight.grad.abs().sum() > 0
    assert student.blocks[-1].mlp.fc1.weight.grad is None  # after the relations: no gradient


def test_relation_loss__different_shapes_are_refused_naming_both():
    a = Relations(torch.zeros(1, 2, 5, 5), torch.zeros(1, 2, 5, 5))
    b = Relations(torch.zeros(1, 2, 9, 9), torch.zeros(1, 2, 9, 9))
    with pytest.raises(ValueError, match=r"\(1, 2, 5, 5\) and teacher relations \(1, 2, 9, 9\)"):
        relation_loss(a, b)


def test_block_relations__refuses_a_missing_block_and_indivisible_heads():
    vit, imgs = _vit(), torch.randn(1, 3, 16, 16)
    with pytest.raises(ConfigError, match="model.student_block 2 is not a block of a 2-block ViT"):
        block_index(vit, 2, "model.student_block")
    assert block_index(vit, -2, "x") == 0
    with pytest.raises(ConfigError, match="32 is not divisible by 3"):
        block_relations(vit, imgs, -1, heads=3)
