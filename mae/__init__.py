"""mae: Masked Autoencoder (He et al., 2021) pretraining on timm and Lightning.

Layers, each a folder: ``models`` (the MAE, no Lightning), ``data``, ``training`` (the Lightning
modules, optimisation, callbacks, checkpoint writing), ``convert`` (checkpoint formats in and out),
``eval`` (kNN, reconstructions); ``cli`` holds every command-line entry point.
"""

from mae.convert.backbone import load_backbone, load_mae
from mae.convert.export import export_encoder
from mae.models import MaskedAutoencoderViT, create_model

__version__ = "0.1.0"
__all__ = ["MaskedAutoencoderViT", "create_model", "export_encoder", "load_backbone", "load_mae"]
