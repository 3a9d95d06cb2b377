"""mae: Masked Autoencoder (He et al., 2021) pretraining on timm and Lightning.

Layers, each a folder, in import order: ``io`` (atomic writes, local-or-S3 storage), ``models`` (the
MAE and its masking, no Lightning), ``data`` (decoding, views, sources and the shard / statistics
tools), ``convert`` (checkpoint formats in and out, export), ``eval`` (frozen
features, kNN, linear probe, reconstruction figures, the demo page), ``training`` (the Lightning
modules, optimisation, per-device settings, callbacks, checkpoint writing), ``cli`` (every
command-line entry point, one module each); ``command`` is how every command is parsed and ends.
"""

from mae import moved
from mae.convert.backbone import load_backbone, load_mae
from mae.convert.export import export_encoder
from mae.models import MaskedAutoencoderViT, create_model

moved.install()  # old module paths (users' configs and scripts) keep working

__version__ = "0.1.0"
__all__ = ["MaskedAutoencoderViT", "create_model", "export_encoder", "load_backbone", "load_mae"]
