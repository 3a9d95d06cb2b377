import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from mae.models import MaskedAutoencoderViT  # noqa: E402
from tests.helpers import TINY  # noqa: E402


@pytest.fixture
def tiny_model() -> MaskedAutoencoderViT:
    torch.manual_seed(0)
    return MaskedAutoencoderViT(**TINY).eval()
