"""A tiny seeded MAE for the format tests: a real named size (so official ``args`` name it), made shallow,
with non-trivial norms so that loading mistakes show."""

import pytest
import torch

from mae.models import MaskedAutoencoderViT, create_model


@pytest.fixture
def tiny_mae() -> MaskedAutoencoderViT:
    torch.manual_seed(0)
    model = create_model("mae_vit_tiny_patch4", depth=2, decoder_depth=1).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.normal_(1.0, 0.1)
                m.bias.normal_(0.0, 0.1)
    return model


def same_outputs(a: torch.nn.Module, b: torch.nn.Module, size: int = 32) -> bool:
    """Whether two encoders give exactly the same tokens on a seeded batch (max diff 0.0)."""
    images = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return torch.equal(a.forward_features(images), b.forward_features(images))
