"""mae: Masked Autoencoder (He et al., 2021) pretraining on timm and Lightning.

Layers, each a folder, in import order: ``errors`` (what a user can fix) and ``compat`` (the private
names of libraries, behind one small module each) at the bottom, ``io`` (atomic writes, local-or-S3
storage), ``models`` (the MAE and its masking, no Lightning), ``data`` (decoding, views, sources and the
shard / statistics tools), ``convert`` (checkpoint formats in and out, export), ``inference`` (what the
applications share), ``eval`` (frozen features, kNN, linear probe), ``training`` (the Lightning modules,
optimisation, per-device settings, callbacks, trackers, checkpoint writing), ``dense`` (detection and
segmentation on the encoder: the feature pyramid, its data, metrics and Lightning modules), ``apps`` (the
applications: reconstruction figures, the page, embeddings and search, anomaly maps, ONNX), ``cli`` (every
command, one module each, and the ``mae`` command over them); ``command`` is how every command is parsed
and ends. ``configs/`` holds the recipes (YAML), shipped with the package.

The public names below are imported on first use, so ``import mae`` (and the ``mae`` command's
``--help``) does not import torch.
"""

import importlib

__version__ = "0.4.0"

# public name -> the module that defines it
_PUBLIC = {
    "MaskedAutoencoderViT": "mae.models",
    "create_model": "mae.models",
    "export_encoder": "mae.convert.export",
    "load_backbone": "mae.convert.backbone",
    "load_mae": "mae.convert.backbone",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'mae' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
