import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from mae.models import MaskedAutoencoderViT  # noqa: E402

TINY = dict(
    img_size=32,
    patch_size=4,
    embed_dim=64,
    depth=2,
    num_heads=4,
    decoder_embed_dim=32,
    decoder_depth=2,
    decoder_num_heads=4,
)


@pytest.fixture
def tiny_model() -> MaskedAutoencoderViT:
    torch.manual_seed(0)
    return MaskedAutoencoderViT(**TINY).eval()
