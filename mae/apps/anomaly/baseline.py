"""The baseline the MAE's anomaly maps are compared with: pixel kNN. Each test image's nearest normal image
(k = 1, Euclidean distance between the normalised images), and each patch's error the mean squared
difference to that neighbour's patch at the same place: "the defect is where the image differs from the
closest normal image". No learning; it scores and maps exactly like the MAE's errors (``scoring``):
``mae anomaly --method pixel-knn`` runs it on image files (``scorers.pixel_knn``), and so does the
benchmark.
"""

import torch
from torch.nn import functional as F


@torch.no_grad()
def nearest_normal_errors(
    imgs: torch.Tensor, normal: torch.Tensor, patch_size: int, chunk: int = 256
) -> torch.Tensor:
    """Per-patch squared difference to the nearest normal image.

    Args:
        imgs: (N, C, H, W) normalised test images.
        normal: (M, C, H, W) normalised normal images, the same size.
        patch_size: p; H and W divisible by it.
        chunk: test images compared at a time (bounds the (chunk, M) distance matrix).

    Returns:
        (N, L) mean squared difference per value of each p x p patch, row-major over the (H/p, W/p) grid.
    """
    flat_normal = normal.flatten(1).float()
    errors = []
    for start in range(0, len(imgs), chunk):
        batch = imgs[start : start + chunk].float()
        nearest = torch.cdist(batch.flatten(1), flat_normal).argmin(dim=1)
        difference = (batch - normal[nearest].float()) ** 2  # (n, C, H, W)
        errors.append(F.avg_pool2d(difference, patch_size).mean(dim=1).flatten(1))  # mean over p x p x C
    return torch.cat(errors)
