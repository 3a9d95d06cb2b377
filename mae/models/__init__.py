"""MAE models: the masked autoencoder, its masking strategies and named sizes."""

from mae.models.factory import (
    MODEL_REGISTRY,
    create_model,
    mae_vit_base_patch16,
    mae_vit_huge_patch14,
    mae_vit_large_patch16,
    mae_vit_small_patch16,
    mae_vit_tiny_patch4,
    mae_vit_tiny_patch16,
)
from mae.models.mae import MaskedAutoencoderViT

__all__ = [
    "MODEL_REGISTRY",
    "MaskedAutoencoderViT",
    "create_model",
    "mae_vit_base_patch16",
    "mae_vit_huge_patch14",
    "mae_vit_large_patch16",
    "mae_vit_small_patch16",
    "mae_vit_tiny_patch4",
    "mae_vit_tiny_patch16",
]
