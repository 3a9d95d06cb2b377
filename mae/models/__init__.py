"""MAE models: the masked autoencoder, its masking strategies, its decoder variants and named sizes."""

from mae.models.factory import (
    MODEL_REGISTRY,
    build_mae,
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
    "build_mae",
    "create_model",
    "mae_vit_base_patch16",
    "mae_vit_huge_patch14",
    "mae_vit_large_patch16",
    "mae_vit_small_patch16",
    "mae_vit_tiny_patch4",
    "mae_vit_tiny_patch16",
]
