"""Private names of timm (tested with timm 1.0.31).

- ``VisionTransformer._pos_embed``: the prefix tokens and the position embeddings (resampled to the
  input's grid with ``dynamic_img_size``) added to the patch tokens. The public ``forward_features``
  and ``forward_intermediates`` add them too, but then run every block on the whole sequence, which a
  windowed (ViTDet) encoder must not.
"""

import torch
from timm.models.vision_transformer import VisionTransformer


def embed_positions(vit: VisionTransformer, patches: torch.Tensor) -> torch.Tensor:
    """``vit``'s prefix tokens and position embeddings on ``patches`` (its ``patch_embed`` output):
    (N, prefix + h * w, D), after its position dropout."""
    return vit._pos_embed(patches)
