"""k-nearest-neighbour classification on frozen features: a fast check of a representation.

Cosine similarity, the k most similar training images vote with weight ``exp(sim / temperature)``.
References: Wu et al., "Unsupervised Feature Learning via Non-Parametric Instance Discrimination"
(2018); the weighted kNN protocol popularised by DINO (Caron et al., 2021).
"""

import sys
from collections.abc import Callable, Sequence

import torch

from mae.convert.pooling import default_pool
from mae.data import ImageDataModule
from mae.errors import ConfigError
from mae.eval.features import FeatureStore, evaluation_subsets, l2_normalised, pooled


def knn_classify(
    train_feats: torch.Tensor,
    train_labels: torch.Tensor,
    test_feats: torch.Tensor,
    num_classes: int,
    k: int = 20,
    temperature: float = 0.07,
    chunk: int = 1024,
) -> torch.Tensor:
    """Class scores (M_test, num_classes) from temperature-weighted votes of the k nearest neighbours.

    Features must be L2-normalised (cosine similarity = dot product).
    """
    k = min(k, len(train_feats))
    scores = []
    for start in range(0, len(test_feats), chunk):
        sim = test_feats[start : start + chunk] @ train_feats.T
        top_sim, top_idx = sim.topk(k, dim=1)
        votes = torch.zeros(len(sim), num_classes)
        votes.scatter_add_(1, train_labels[top_idx], (top_sim / temperature).exp())
        scores.append(votes)
    return torch.cat(scores)


def knn_accuracy(
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    num_classes: int,
    k: int = 20,
    temperature: float = 0.07,
) -> tuple[float, float]:
    """(top-1, top-5) accuracy in percent of kNN on (features, labels) pairs."""
    scores = knn_classify(train[0], train[1], test[0], num_classes, k, temperature)
    top = scores.topk(min(5, num_classes), dim=1).indices
    labels = test[1].unsqueeze(1)
    return (
        100.0 * (top[:, :1] == labels).any(1).float().mean().item(),
        100.0 * (top == labels).any(1).float().mean().item(),
    )


def knn_evaluate(
    model: torch.nn.Module,
    data: ImageDataModule,
    k: int = 20,
    temperature: float = 0.07,
    device: torch.device | str = "cpu",
    max_train: int | None = None,
    max_val: int | None = None,
    progress: bool = True,
    announce: Callable[[int, int], None] | None = None,
    notes: bool = True,
    blocks: Sequence[int] | None = None,
) -> tuple[float, float, int]:
    """(top-1 %, top-5 %, number of queries) of kNN on ``model``'s features pooled by default (the cls token
    of a ViT, the mean of a CNN's last map: ``mae.convert.pooling.default_pool``; L2-normalised, float):
    ``data``'s training split (evaluation transform; a fixed subset of ``max_train`` images when
    larger) is the memory bank, its validation split (a fixed subset of ``max_val`` images when larger)
    the queries. A ``k`` above the memory bank's size is lowered to it, with a note on stderr.

    ``blocks``: read these encoder blocks instead of the last (negative from the end; their pooled vectors
    concatenated: ``mae.convert.pooling.pooled``).

    ``progress``: show the feature extraction's progress on stderr (``mae.io.progress``);
    ``announce``: called with (memory-bank images, queries) once they are known, before any feature
    is extracted; ``notes``: print the note on a lowered ``k`` (one process of several: False).

    Raises:
        ConfigError: the data module has no validation split.
    """
    encode = l2_normalised(pooled(model, default_pool(model), blocks))  # a bad block fails before extraction
    train_set, val_set = data.feature_datasets()
    if val_set is None:
        raise ConfigError(f"kNN evaluation needs a validation split; {type(data).__name__} has none")
    train_set, val_set = evaluation_subsets(train_set, val_set, max_train, max_val, announce)
    if k > len(train_set) and notes:
        print(
            f"note: k={k} neighbours, but the memory bank holds {len(train_set)} training images: all "
            f"{len(train_set)} vote",
            file=sys.stderr,
        )
    train, val = (
        FeatureStore.extract(
            encode,
            ds,
            data.batch_size,
            data.num_workers,
            device,
            progress=f"kNN: features of the {split} split" if progress else None,
        ).tensors()
        for ds, split in ((train_set, "training"), (val_set, "validation"))
    )
    return *knn_accuracy(train, val, data.num_labels, k, temperature), len(val_set)
