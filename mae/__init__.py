"""mae: Masked Autoencoder (He et al., 2021) pretraining on timm and Lightning."""

from mae.backbone import load_backbone, load_mae
from mae.models import MaskedAutoencoderViT, create_model

__version__ = "0.1.0"
__all__ = ["MaskedAutoencoderViT", "create_model", "load_backbone", "load_mae"]
