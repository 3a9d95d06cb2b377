"""MAE models: the ViT masked autoencoder, its masking strategies, its decoder variants, the CNN member
(``cnn``: SparK, FCMAE) and the named models of both."""

from mae.models.cnn import MaskedAutoencoderCNN
from mae.models.factory import (
    MODEL_REGISTRY,
    build_mae,
    build_model,
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
    "MaskedAutoencoderCNN",
    "MaskedAutoencoderViT",
    "build_mae",
    "build_model",
    "create_model",
    "mae_vit_base_patch16",
    "mae_vit_huge_patch14",
    "mae_vit_large_patch16",
    "mae_vit_small_patch16",
    "mae_vit_tiny_patch4",
    "mae_vit_tiny_patch16",
]
