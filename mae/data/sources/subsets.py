"""Subsets of a dataset: a class-balanced labelled fraction, and a fixed sample for monitors."""

import torch
from torch.utils.data import Dataset, Subset

from mae.errors import InputError


def labelled_fraction(dataset: Dataset, fraction: float, seed: int = 0) -> Subset:
    """A seeded, class-balanced subset: ``round(fraction * n_c)`` (at least 1) images of each class c.

    The dataset must expose ``targets`` (ImageFolder, CIFAR and digits do); ``classes`` is kept.
    """
    if not 0 < fraction <= 1:
        raise InputError(f"train fraction must be in (0, 1], got {fraction}")
    targets = torch.as_tensor(dataset.targets)
    generator = torch.Generator().manual_seed(seed)
    keep = []
    for label in targets.unique().tolist():
        members = torch.nonzero(targets == label).flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        keep += members[: max(1, round(fraction * len(members)))].tolist()
    subset = Subset(dataset, sorted(keep))
    subset.classes = getattr(dataset, "classes", None)
    return subset


def fixed_subset(dataset: Dataset, count: int, seed: int = 0) -> Dataset:
    """At most ``count`` samples of ``dataset``, the same ones every call, drawn without touching the
    global RNG: a seeded random subset, or the first ``count`` of a dataset stored in random order
    (``stored_in_random_order``, e.g. shards), which reads the fewest shards."""
    if len(dataset) <= count:
        return dataset
    if getattr(dataset, "stored_in_random_order", False):
        return Subset(dataset, range(count))
    keep = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:count]
    return Subset(dataset, keep.tolist())
