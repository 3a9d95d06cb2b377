"""TinyMIM's relation targets: the self-attention relations of one block of a timm ViT, and the KL
divergence that distils a teacher's relations into a student.

For a block's input tokens ``x`` (N, T, D), cls token included, the block's own ``norm1`` and
``attn.qkv`` (and its ``q_norm`` / ``k_norm`` when built with ``qk_norm``) give queries, keys and values,
split into ``h`` relation heads of width ``d = D / h``. Per head, over all T tokens:

- the query-key relation ``softmax(Q Kᵀ / √d)``: the block's attention probabilities when ``h`` is its
  own head count;
- the value-value relation ``softmax(V Vᵀ / √d)``.

TinyMIM gives the student's last block the teacher's head count; here the student stays a plain timm
ViT and its q, k and v are split into the *teacher's* head count instead (``d`` = the student's width /
the teacher's heads), which is the same computation: the relations use only ``norm1`` and ``qkv``, whose
weights do not depend on the head count.

The loss (``relation_loss``) is TinyMIM's: for each relation, KL(teacher || student) of each row, summed
over the row's T entries (the keys) and averaged over the batch, the heads and the T rows (the queries);
the query-key and value-value losses are added, unweighted.

References: TinyMIM (Ren et al., CVPR 2023), its public implementation (OliverRensu/TinyMIM:
``models_tinymim.py``, ``vit.py``, ``engine_pretrain.py``) for the head split, the scale and the averaging;
MiniLM v2 (Wang et al., 2021) for relations with another head count than the model's.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from timm.models.vision_transformer import Block, VisionTransformer

from mae.errors import ConfigError


@dataclass(frozen=True)
class Relations:
    """One block's relations as log-probabilities, each (N, h, T, T): row ``i`` of head ``j`` is token
    ``i``'s distribution over the T tokens."""

    qk: torch.Tensor
    vv: torch.Tensor


@dataclass(frozen=True)
class RelationLoss:
    """The distillation loss (``total`` = ``qk`` + ``vv``), each a scalar tensor."""

    total: torch.Tensor
    qk: torch.Tensor
    vv: torch.Tensor


def block_index(vit: VisionTransformer, block: int, setting: str) -> int:
    """``block`` (0-based, negative from the end: -1 the last) as an index into ``vit.blocks``.

    Raises:
        ConfigError: naming ``setting`` and the blocks ``vit`` has.
    """
    depth = len(vit.blocks)
    if isinstance(block, bool) or not isinstance(block, int) or not -depth <= block < depth:
        raise ConfigError(
            f"{setting} {block!r} is not a block of a {depth}-block ViT: give 0 to {depth - 1}, or -1 to "
            f"-{depth} from the end"
        )
    return block % depth


def check_relation_heads(width: int, heads: int, setting: str) -> None:
    """Raises ConfigError, naming ``setting``, unless ``heads`` relation heads split a ``width``-wide
    block into equal heads."""
    if heads < 1 or width % heads:
        raise ConfigError(
            f"{setting}: a {width}-wide block cannot be split into the teacher's {heads} relation heads "
            f"({width} is not divisible by {heads}); choose a student whose width is a multiple of {heads}"
        )


@contextmanager
def captured_attention_inputs(block: Block) -> Iterator[dict[str, torch.Tensor]]:
    """Inside the block, each forward of ``block`` leaves in the yielded dict its attention's queries and
    keys after ``q_norm`` / ``k_norm`` ("q", "k": (N, own heads, T, own head dim)) and its ``qkv`` output
    ("qkv": (N, T, 3 D)). Forward hooks, so that the model runs through its own ``forward`` (what DDP,
    FSDP2 and ``torch.compile`` wrap)."""
    attn, captured = block.attn, {}

    def keep(name: str) -> Callable:
        return lambda module, inputs, output: captured.__setitem__(name, output)

    hooks = [attn.qkv.register_forward_hook(keep("qkv"))]
    hooks += [attn.q_norm.register_forward_hook(keep("q")), attn.k_norm.register_forward_hook(keep("k"))]
    try:
        yield captured
    finally:
        for hook in hooks:
            hook.remove()


def regroup_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(N, h, T, d) -> (N, heads, T, h d / heads): the heads' channels concatenated, then split again."""
    n, h, t, d = x.shape
    return x.transpose(1, 2).reshape(n, t, heads, h * d // heads).transpose(1, 2)


def relation_log_probs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """log softmax(A Bᵀ / √d) over the last axis, in float32: (N, h, T, d) twice -> (N, h, T, T)."""
    a, b = a.float(), b.float()
    return (a @ b.transpose(-2, -1) * a.shape[-1] ** -0.5).log_softmax(dim=-1)


def block_relations(
    vit: VisionTransformer, imgs: torch.Tensor, block: int, heads: int | None = None
) -> Relations:
    """The relations of ``vit.blocks[block]`` (0-based, negative from the end) on (N, C, H, W) images,
    with ``heads`` relation heads (default: the block's own), in float32 (outside autocast: a softmax
    over T tokens in bf16 loses the small probabilities the KL divergence weighs). ``vit`` runs its whole
    ``forward``; its queries, keys and values are read in that block (``captured_attention_inputs``).

    Raises:
        ConfigError: a block ``vit`` does not have, or a head count that does not divide its width.
    """
    chosen = vit.blocks[block_index(vit, block, "relation block")]
    own, head_dim = chosen.attn.num_heads, chosen.attn.head_dim
    heads = own if heads is None else heads
    check_relation_heads(own * head_dim, heads, "relation heads")
    with captured_attention_inputs(chosen) as captured:
        vit(imgs)
    n, t, _ = captured["qkv"].shape
    v = captured["qkv"].reshape(n, t, 3, own, head_dim)[:, :, 2].transpose(1, 2)  # (N, own heads, T, d)
    q, k, v = (regroup_heads(x, heads) for x in (captured["q"], captured["k"], v))
    with torch.autocast(imgs.device.type, enabled=False):
        return Relations(qk=relation_log_probs(q, k), vv=relation_log_probs(v, v))


def kl_divergence(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) of each row, summed over the last axis, averaged over every other: both
    (..., T) log-probabilities. A teacher probability of 0 adds 0 (``xlogy``)."""
    p = teacher.exp()
    return (torch.special.xlogy(p, p) - p * student).sum(dim=-1).mean()


def relation_loss(student: Relations, teacher: Relations) -> RelationLoss:
    """TinyMIM's loss: KL(teacher || student) of the query-key relations plus that of the value-value
    relations (each ``kl_divergence``: summed over keys, averaged over batch, heads and queries).

    Raises:
        ValueError: relations of different shapes (another token or head count), naming both.
    """
    if student.qk.shape != teacher.qk.shape:
        raise ValueError(
            f"student relations {tuple(student.qk.shape)} and teacher relations {tuple(teacher.qk.shape)} "
            "differ: (N, heads, T, T) must agree"
        )
    qk = kl_divergence(teacher.qk, student.qk)
    vv = kl_divergence(teacher.vv, student.vv)
    return RelationLoss(total=qk + vv, qk=qk, vv=vv)
