"""Anomaly scores from a memory of normal patch features, as PatchCore (Roth et al., 2022) scores them: the
encoder's patch tokens of the normal images, subsampled by a greedy coreset, and each test patch's
Euclidean distance to its nearest one. ``mae anomaly --method features`` runs it on image files.

- Features: the encoder run on every patch (no masking, evaluation mode), the patch tokens (no cls token)
  of the last block, or of 2-3 chosen blocks concatenated (``feature_blocks``), without the final norm,
  each averaged over its ``neighbourhood`` x ``neighbourhood`` patches (3: PatchCore's local
  aggregation; the average of the neighbours inside the image at the border). A CNN's "blocks" are its
  stages (timm's ``feature_info``: a ResNet's stem and layer1-4, a ConvNeXt's four stages), by default its
  stride-8 and stride-16 ones (``default_feature_blocks``: a ResNet's layer2 and layer3, PatchCore's
  choice, mid-level features neither too local nor too ImageNet-specific); maps of coarser stages are
  resized bilinearly to the finest chosen one before they are concatenated, as PatchCore does, and the
  patch grid is that map's.
- Memory bank: the greedy k-center coreset (``coreset``) of the normal images' patch vectors, chosen on a
  seeded Gaussian random projection to ``PROJECTION_DIM`` dimensions, as PatchCore's sampler does; exact,
  in rounds of batched distance updates (``greedy_k_center``).
- Scores: each test patch's distance to its nearest bank vector (``nearest_distances``: ``torch.cdist`` in
  blocks of ``QUERY_BLOCK`` test rows x ``BANK_BLOCK`` bank rows, so the distances held at once never
  exceed one block's, 64 MiB at float32, whatever the bank's size). The image score is the highest patch
  score (PatchCore's); the map is the patch scores upsampled bilinearly to the input size, then smoothed
  by a Gaussian of ``SIGMA`` pixels (``smooth_maps``).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from scipy import ndimage
from torch import nn
from torch.nn import functional as F

from mae.convert.pooling import feature_depth, resolve_blocks  # noqa: F401 (feature_depth: read from here too)
from mae.errors import ConfigError

DEFAULT_FRACTION = 0.1  # of the normal patch vectors kept in the bank (PatchCore: 1-10 %)
DEFAULT_NEIGHBOURHOOD = 3  # patches averaged around each, per side (PatchCore's 3 x 3)
PROJECTION_DIM = 128  # the coreset's distances are measured on a random projection to this many dimensions
CANDIDATES = 1024  # the points each round of the greedy coreset considers (benchmarks/coreset.py)
UPDATE_BLOCK = 4096  # points per distance block of a round's update: 4096 x 1024 float32 = 16 MiB
# The coreset's float32 squared distances |x|^2 + |y|^2 - 2 x.y are rounded by at most ROUNDING float32 eps
# times the largest |x|^2 (measured: under 5 eps times |x|^2 + |y|^2 at D = 16 and 128); when the largest
# is under PRECISION_MARGIN times that, greedy_k_center goes on in float64.
ROUNDING = 16
PRECISION_MARGIN = 100
QUERY_BLOCK = 1024  # test patch vectors per distance block
BANK_BLOCK = 16384  # bank vectors per distance block: 1024 x 16384 float32 distances = 64 MiB
SIGMA = 4.0  # the maps' Gaussian smoothing, pixels (PatchCore's)
MAX_BLOCKS = 3  # blocks whose outputs may be concatenated
# A CNN's default stages, from the end: the stride-8 and stride-16 maps of a ResNet (layer2, layer3:
# PatchCore's; its stem counts as a stage in timm's feature_info) and of a ConvNeXt (stages 1 and 2).
CNN_FEATURE_BLOCKS = (-3, -2)


def default_feature_blocks(encoder: nn.Module) -> list[int] | None:
    """The blocks read when none are chosen: None (the last) for a ViT, ``CNN_FEATURE_BLOCKS`` for a CNN."""
    return None if hasattr(encoder, "blocks") else list(CNN_FEATURE_BLOCKS)


def feature_blocks(blocks: Sequence[int] | None, depth: int) -> list[int]:
    """The encoder blocks whose outputs are the features, as indices in [0, depth), ascending (``blocks``
    from the first block (0) or from the end (-1 the last); None: the last): ``resolve_blocks`` with at
    most ``MAX_BLOCKS``.

    Raises:
        ConfigError: more than ``MAX_BLOCKS`` blocks, a block outside the encoder's depth or one named
            twice, naming the value and the depth.
    """
    return resolve_blocks(blocks, depth, MAX_BLOCKS)


@torch.no_grad()
def feature_maps(
    encoder: nn.Module,
    imgs: torch.Tensor,
    blocks: Sequence[int],
    neighbourhood: int = DEFAULT_NEIGHBOURHOOD,
) -> torch.Tensor:
    """(N, C, H, W) normalised input -> (N, D', h, w) float32 feature maps: the outputs of ``blocks``
    (indices in [0, depth)) of a timm ViT (h, w = H/p, W/p) or CNN (h, w: the finest chosen stage's; the
    coarser maps resized to it, bilinear) concatenated along channels, each position's the mean over its
    ``neighbourhood`` x ``neighbourhood`` positions (odd; 1: none; at the border, those inside)."""
    outputs = encoder.forward_intermediates(
        imgs, indices=list(blocks), norm=False, output_fmt="NCHW", intermediates_only=True
    )
    size = max((o.shape[-2:] for o in outputs), key=lambda s: s[0] * s[1])  # the finest map's
    outputs = [
        o if o.shape[-2:] == size else F.interpolate(o, size=size, mode="bilinear", align_corners=False)
        for o in outputs
    ]
    grid = torch.cat(outputs, dim=1).float()  # (N, D * len(blocks), h, w)
    if neighbourhood > 1:
        grid = F.avg_pool2d(
            grid, neighbourhood, stride=1, padding=neighbourhood // 2, count_include_pad=False
        )
    return grid


def patch_features(
    encoder: nn.Module,
    imgs: torch.Tensor,
    blocks: Sequence[int],
    neighbourhood: int = DEFAULT_NEIGHBOURHOOD,
) -> torch.Tensor:
    """(N, C, H, W) normalised input -> (N, L, D') float32 patch vectors, row-major over the (h, w) grid of
    ``feature_maps``."""
    return feature_maps(encoder, imgs, blocks, neighbourhood).flatten(2).transpose(1, 2)


def _point_rows(points: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(M, D) points -> (M, D + 2) rows [x, |x|^2, 1] of ``dtype``, x the point less the points' mean
    (smaller norms: less rounding in |x|^2 + |y|^2 - 2 x.y)."""
    count, dim = points.shape
    rows = torch.empty(count, dim + 2, dtype=dtype, device=points.device)
    rows[:, :dim] = points.to(dtype) - points.to(dtype).mean(dim=0)
    rows[:, dim] = rows[:, :dim].square().sum(dim=1)
    rows[:, dim + 1] = 1.0
    return rows


def _center_rows(rows: torch.Tensor) -> torch.Tensor:
    """(C, D + 2) point rows [x, |x|^2, 1] -> the same points as center rows [-2 x, 1, |x|^2]."""
    return torch.cat([-2 * rows[:, :-2], rows[:, -1:], rows[:, -2:-1]], dim=1)


def _squared_distances(rows: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """(R, C) squared Euclidean distances, clamped at 0, between (R, D + 2) point ``rows`` and (C, D + 2)
    ``centers`` rows (``_center_rows``): one matrix product, |x|^2 + |y|^2 - 2 x.y."""
    return (rows @ centers.T).clamp_(min=0)


def _lower_nearest(nearest: torch.Tensor, rows: torch.Tensor, picked: torch.Tensor) -> None:
    """Lower (M,) ``nearest`` squared distances in place to each of the (M, D + 2) point ``rows``'
    distance to the points ``picked`` (indices), in blocks of ``UPDATE_BLOCK`` rows x ``CANDIDATES``
    picks; the picked points' own entries become -1 (picked: never a candidate again)."""
    for p in range(0, len(picked), CANDIDATES):
        centers = _center_rows(rows[picked[p : p + CANDIDATES]])
        for b in range(0, len(rows), UPDATE_BLOCK):
            block = nearest[b : b + UPDATE_BLOCK]  # a view: written through
            closest = _squared_distances(rows[b : b + UPDATE_BLOCK], centers).amin(dim=1)
            torch.minimum(block, closest, out=block)
    nearest.index_fill_(0, picked, -1.0)


def _picks_among(distances: torch.Tensor, nearest: torch.Tensor, tau: float, most: int) -> list[int]:
    """Greedy k-center inside one round's candidates (CPU tensors: the loop's steps are too small for a
    GPU): up to ``most`` picks (indices into the candidates), each the candidate of largest ``nearest``
    (C,), which then falls to its row of the (C, C) squared ``distances``, for as long as that largest is
    at least ``tau`` (the largest of the points that are no candidates, which can only have fallen since)
    and not negative (-1: picked in an earlier round)."""
    nearest = nearest.clone()
    picks = []
    while len(picks) < most:
        best = int(nearest.argmax())
        if nearest[best].item() < max(tau, 0.0):
            break
        picks.append(best)
        torch.minimum(nearest, distances[best], out=nearest)
        nearest[best] = -float("inf")
    return picks


def greedy_k_center(
    points: torch.Tensor, k: int, start: int = 0, candidates: int = CANDIDATES
) -> torch.Tensor:
    """Greedy k-center selection: from ``start``, each next pick the point farthest (Euclidean) from every
    point picked so far; never a point twice (duplicates of picked points, at distance 0, come last).

    The plain greedy's picks, in rounds instead of one pass over all the points per pick: each point's
    squared distance to its nearest pick so far is kept; a round takes the ``candidates`` points farthest
    from the picks and runs the greedy among them alone (their (C, C) distances) for as long as the
    farthest candidate is at least as far as every other point was at the round's start -- so each pick
    is the one the plain greedy would make -- then lowers every point's distance to the round's picks in
    matrix products (|x|^2 + |y|^2 - 2 x.y, clamped at 0). In float32 while the largest squared distance
    is at least ``PRECISION_MARGIN`` times float32's rounding of it, then (all distances recomputed) in
    float64. Ties and rounding may pick another point of the same distance: the coverage radius is the
    plain greedy's.

    Args:
        points: (M, D) float.
        k: picks, 1 to M.
        start: the first pick's index.
        candidates: the points a round considers (``CANDIDATES``; small values only for the tests).

    Returns:
        (k,) long indices into ``points``, distinct, in pick order, on its device. Time O(k M D) in matrix
        products, in 2-3 k / ``candidates`` rounds (benchmarks/coreset.py); memory one (M, D + 2) float32
        copy (float64 after the switch), one ``UPDATE_BLOCK`` x ``candidates`` block and the (C, C)
        candidates' distances. A few host syncs a round, none a pick.

    Raises:
        ConfigError: k outside 1 to M or ``start`` outside [0, M).
    """
    count = len(points)
    if not 1 <= k <= count or not 0 <= start < count:
        raise ConfigError(
            f"greedy_k_center takes 1 to {count} picks from a start in [0, {count}): got k={k}, start={start}"
        )
    rows = _point_rows(points, torch.float32)
    # below this, a squared distance's float32 rounding is over 1 / PRECISION_MARGIN of it
    coarse = PRECISION_MARGIN * ROUNDING * torch.finfo(torch.float32).eps * float(rows[:, -2].max())
    nearest = torch.full((count,), float("inf"), device=points.device)  # squared; -1 once picked
    picks = torch.empty(k, dtype=torch.long, device=points.device)
    picks[0] = start
    new, done = picks[:1], 1
    while True:
        _lower_nearest(nearest, rows, new)
        if done == k:
            return picks
        top = nearest.topk(min(candidates + 1, count))
        if rows.dtype == torch.float32 and float(top.values[0]) < coarse:
            rows = _point_rows(points, torch.float64)
            nearest = torch.full((count,), float("inf"), dtype=torch.float64, device=points.device)
            _lower_nearest(nearest, rows, picks[:done])
            top = nearest.topk(min(candidates + 1, count))
        chosen = top.indices[:candidates]
        tau = float(top.values[candidates]) if len(top.values) > candidates else -float("inf")
        if rows.dtype == torch.float32:
            tau = max(tau, coarse)  # the picks below it are the next round's, in float64
        distances = _squared_distances(rows[chosen], _center_rows(rows[chosen]))
        found = _picks_among(distances.cpu(), top.values[:candidates].cpu(), tau, k - done)
        new = chosen[torch.tensor(found, device=points.device)]
        picks[done : done + len(new)] = new
        done += len(new)


def coreset(features: torch.Tensor, fraction: float, seed: int = 0) -> torch.Tensor:
    """The indices (ascending: the bank keeps the features' order) of ``round(fraction * M)`` (at least 1)
    of (M, D) ``features``, chosen by ``greedy_k_center`` on their projection to ``PROJECTION_DIM``
    dimensions by a Gaussian matrix drawn from ``seed`` (none when D is not larger), starting from an index
    drawn from the same generator; ``fraction`` 1 keeps them all."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"--coreset-fraction must be in (0, 1], got {fraction}")
    count = len(features)
    if fraction == 1:
        return torch.arange(count, device=features.device)
    generator = torch.Generator().manual_seed(seed)
    points = features.float()
    if points.shape[1] > PROJECTION_DIM:
        projection = torch.randn(points.shape[1], PROJECTION_DIM, generator=generator)
        points = points @ projection.to(points.device)
    start = int(torch.randint(count, (1,), generator=generator))
    return greedy_k_center(points, max(1, round(fraction * count)), start).sort().values


@torch.no_grad()
def nearest_distances(
    queries: torch.Tensor,
    bank: torch.Tensor,
    query_block: int = QUERY_BLOCK,
    bank_block: int = BANK_BLOCK,
) -> torch.Tensor:
    """(N,) each of (N, D) ``queries``' Euclidean distance to its nearest row of (M, D) ``bank``.

    ``torch.cdist`` on ``query_block`` x ``bank_block`` blocks with a running minimum: memory beyond the
    inputs is one block's (query_block x bank_block) float32 distances and cdist's working copy of it,
    about 2 x 64 MiB at the defaults, for any M. The nearest row is found on cdist's matrix-product
    distances; the distance returned is recomputed directly to it, so an exact match scores 0.
    """
    best = torch.full((len(queries),), float("inf"), device=queries.device)
    index = torch.zeros(len(queries), dtype=torch.long, device=queries.device)
    for q in range(0, len(queries), query_block):
        rows, row_best, row_index = (t[q : q + query_block] for t in (queries.float(), best, index))
        for b in range(0, len(bank), bank_block):
            nearest = torch.cdist(rows, bank[b : b + bank_block].float()).min(dim=1)
            closer = nearest.values < row_best  # the views write through to best and index
            row_best[closer] = nearest.values[closer]
            row_index[closer] = nearest.indices[closer] + b
    return torch.linalg.vector_norm(queries.float() - bank[index].float(), dim=1)


def smooth_maps(maps: torch.Tensor, sigma: float = SIGMA) -> torch.Tensor:
    """(N, H, W) maps each smoothed by a Gaussian of ``sigma`` pixels (``scipy.ndimage.gaussian_filter``,
    as PatchCore: truncated at 4 sigma, mirrored at the border), float32."""
    smoothed = ndimage.gaussian_filter(maps.double().cpu().numpy(), sigma=(0, sigma, sigma))
    return torch.from_numpy(smoothed).float()


@dataclass
class FeatureMemory:
    """A feature scorer: ``encoder`` (eval mode), the feature ``blocks`` and ``neighbourhood`` of
    ``patch_features``, and the (K, D) ``bank`` of normal patch vectors on the encoder's device (None until
    it is fitted: ``features`` makes the vectors it is chosen from)."""

    encoder: nn.Module
    blocks: list[int]
    neighbourhood: int
    bank: torch.Tensor | None = None

    def features(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, L, D') patch vectors (``patch_features``), on the encoder's device."""
        device = next(self.encoder.parameters()).device
        return patch_features(self.encoder, imgs.to(device), self.blocks, self.neighbourhood)

    def grid_size(self, img_size: tuple[int, int], in_chans: int) -> tuple[int, int]:
        """(h, w): the patch grid of (H, W) = ``img_size`` inputs: a ViT's patches, a CNN's finest chosen
        map (measured on one blank image: its size follows the stages' padding)."""
        patch_embed = getattr(self.encoder, "patch_embed", None)
        if patch_embed is not None:
            return tuple(patch_embed.grid_size)
        device = next(self.encoder.parameters()).device
        blank = torch.zeros(1, in_chans, *img_size, device=device)
        return tuple(feature_maps(self.encoder, blank, self.blocks, 1).shape[-2:])

    def errors(self, imgs: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, L): each patch's distance to its nearest bank vector (feature units)."""
        vectors = self.features(imgs)
        return nearest_distances(vectors.flatten(0, 1), self.bank).view(vectors.shape[:2])
