"""A linear probe that converges at any scale: frozen features computed once, then many linear
heads trained at once over a grid of learning rates and weight decays.

The paper's probe (BatchNorm + linear head, LARS, 90 epochs at batch 16,384) is tuned for
ImageNet; at the scale most users work at it has not converged and understates the encoder. Here
the encoder runs once over the data (cls token and / or average-pooled patch tokens), the features
are standardised with the training split's statistics, and every (lr, weight decay) pair of the
grid trains its own softmax-regression head, all in one batched matmul per step (as DINOv2's
linear evaluation does). A held-out part of the training split chooses the head (by accuracy)
and stops the training (when no head's held-out loss improves any more); the validation split is
only scored, never used to choose.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from mae.convert.pooling import check_pool, default_pool
from mae.data import ImageDataModule
from mae.errors import ConfigError
from mae.eval.features import FeatureStore, Pool, evaluation_subsets, pooled
from mae.io.progress import Progress

DEFAULT_LRS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
DEFAULT_WEIGHT_DECAYS = (0.0, 1e-4, 1e-3)


def check_grid(lrs: list[float], weight_decays: list[float]) -> None:
    """Raises ValueError naming ``probe.lrs`` / ``probe.weight_decays`` for an empty grid, a
    non-positive or non-finite learning rate or a negative or non-finite weight decay."""
    if not lrs or not all(0 < lr < math.inf for lr in lrs):
        raise ConfigError(f"probe.lrs must be positive learning rates, got {list(lrs)}")
    if not weight_decays or not all(0 <= wd < math.inf for wd in weight_decays):
        raise ConfigError(f"probe.weight_decays must be >= 0, got {list(weight_decays)}")


@dataclass
class ProbeResult:
    lr: float  # the chosen head's
    weight_decay: float
    epochs: int  # trained until the held-out accuracy stopped improving
    holdout_acc1: float  # % on the held-out part of the training split (what chose the head)
    val_acc1: float  # % on the validation split
    val_acc5: float
    grid: list[dict] = field(default_factory=list)  # every head's held-out accuracy

    def __str__(self) -> str:
        return (
            f"linear probe: top-1 {self.val_acc1:.2f}%, top-5 {self.val_acc5:.2f}% (lr {self.lr:g}, weight "
            f"decay {self.weight_decay:g}, best after {self.epochs} epochs; held-out top-1 "
            f"{self.holdout_acc1:.2f}%)"
        )


def check_training(max_epochs: int, patience: int, holdout: float) -> None:
    """Raises ValueError naming ``probe.max_epochs`` / ``probe.patience`` below 1 (untrained heads
    have nothing to report) or ``probe.holdout`` outside (0, 1)."""
    if max_epochs < 1 or patience < 1:
        raise ConfigError(
            f"probe.max_epochs and probe.patience must be >= 1, got {max_epochs} and {patience}: untrained "
            "heads have nothing to report"
        )
    if not 0 < holdout < 1:
        raise ConfigError(f"probe.holdout must be in (0, 1), got {holdout}")


@dataclass(frozen=True)
class ProbeSettings:
    """A probe run's settings, checked when built (by the command, the callback): ``pool`` "cls",
    "avg" or "both" (None: the encoder's default, ``mae.convert.pooling.default_pool``: "cls" for a ViT,
    "avg" for a CNN); ``views`` of each training image (1: the evaluation view; more: that many with
    the training augmentation); the (lr, weight decay) grid (None: ``DEFAULT_LRS`` /
    ``DEFAULT_WEIGHT_DECAYS``); the heads' ``max_epochs`` and early-stop ``patience``; the
    ``holdout`` fraction that chooses the head; the ``seed`` of the split and of the heads; the encoder
    ``blocks`` read (negative from the end; None: the last; several: their pooled vectors concatenated,
    ``mae.convert.pooling.pooled``; checked against the encoder when it is known)."""

    pool: Pool | None = None
    views: int = 1
    lrs: tuple[float, ...] | None = None
    weight_decays: tuple[float, ...] | None = None
    max_epochs: int = 100
    patience: int = 10
    holdout: float = 0.1
    seed: int = 0
    blocks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lrs", tuple(self.lrs or DEFAULT_LRS))
        if self.blocks is not None:
            object.__setattr__(self, "blocks", tuple(self.blocks))
        weight_decays = DEFAULT_WEIGHT_DECAYS if self.weight_decays is None else self.weight_decays
        object.__setattr__(self, "weight_decays", tuple(weight_decays))
        check_grid(list(self.lrs), list(self.weight_decays))
        check_training(self.max_epochs, self.patience, self.holdout)
        if self.pool is not None:
            check_pool(self.pool)  # a bad pool name fails now
        if self.views < 1:
            raise ConfigError(f"probe views must be >= 1, got {self.views}")


def evaluate(
    model: torch.nn.Module,
    data: ImageDataModule,
    settings: ProbeSettings,
    device: torch.device | str = "cpu",
    cache: str | Path | None = None,
    max_train: int | None = None,
    max_val: int | None = None,
    progress: bool = True,
    announce: Callable[[int, int], None] | None = None,
) -> tuple[ProbeResult, int, int]:
    """(result, validation images, training views) of the linear probe on ``model``'s frozen
    features: heads trained on ``data``'s training split (a fixed subset of ``max_train`` images when
    larger), chosen on a held-out part of it, scored on its validation split (a fixed subset of
    ``max_val`` images when larger). ``cache``: a file prefix to keep the features on disk
    (memory-mapped) instead of in memory. ``progress``: show the feature extraction's and the heads'
    training's progress on stderr (``mae.io.progress``); ``announce``: called with (training images,
    validation images) once they are known, before any feature is extracted.

    Raises:
        ConfigError: the data has fewer than 2 classes or no validation split; a block outside the encoder
            (``settings.blocks``, named as ``--feature-blocks``).
    """
    encoder = pooled(model, settings.pool or default_pool(model), settings.blocks)  # a bad block fails now
    train, val = extract_splits(
        encoder,
        data,
        "linear probe",
        views=settings.views,
        seed=settings.seed,
        device=device,
        cache=cache,
        max_train=max_train,
        max_val=max_val,
        progress=progress,
        announce=announce,
    )
    result = _train_heads(
        train,
        val,
        data.num_labels,
        settings.lrs,
        settings.weight_decays,
        settings.holdout,
        settings.max_epochs,
        settings.patience,
        seed=settings.seed,
        progress=progress,
    )
    return result, len(val), len(train)


def extract_splits(
    encode: Callable[[torch.Tensor], torch.Tensor],
    data: ImageDataModule,
    name: str,
    *,
    views: int = 1,
    seed: int = 0,
    device: torch.device | str = "cpu",
    cache: str | Path | None = None,
    max_train: int | None = None,
    max_val: int | None = None,
    progress: bool = True,
    announce: Callable[[int, int], None] | None = None,
) -> tuple[FeatureStore, FeatureStore]:
    """(training, validation) features of the probe ``name`` ("linear probe"): ``encode`` ((N, C, H, W)
    normalised images -> (N, D) float) over ``data``'s training split (``views`` views of each image: 1
    the evaluation view, more that many with the training augmentation, drawn from ``seed``; a fixed
    subset of ``max_train`` images when larger) and over its validation split (a fixed subset of
    ``max_val``), into ``cache`` (``<cache>.train``, ``<cache>.val``: memory-mapped ``.npy`` files) when
    given, else in memory; ``progress`` and ``announce`` as ``evaluate`` says.

    Raises:
        ConfigError: the data has fewer than 2 classes or no validation split.
    """
    article = "an" if name[0] in "aeiou" else "a"
    if data.num_labels < 2:
        raise ConfigError(
            f"{article} {name} needs labelled data with 2 or more classes; {type(data).__name__} has "
            f"{data.num_labels}"
        )
    normalised = lambda imgs: encode(data.normalize(imgs))  # noqa: E731  (augmented views may be uint8)
    feature_train, val_set = data.feature_datasets()
    if val_set is None:
        raise ConfigError(f"{article} {name} is scored on a validation split; {type(data).__name__} has none")
    train_set = (
        data.build_datasets(data.train_transform(), data.eval_transform())[0] if views > 1 else feature_train
    )
    train_set, val_set = evaluation_subsets(train_set, val_set, max_train, max_val, announce)
    torch.manual_seed(seed)
    prefix = lambda split: None if cache is None else f"{cache}.{split}"  # noqa: E731
    shown = lambda split: f"{name}: features of the {split} split" if progress else None  # noqa: E731
    loading = (data.batch_size, data.num_workers, device)
    train = FeatureStore.extract(normalised, train_set, *loading, views, prefix("train"), shown("training"))
    val = FeatureStore.extract(normalised, val_set, *loading, 1, prefix("val"), shown("validation"))
    return train, val


def train_probe(
    train: FeatureStore,
    val: FeatureStore,
    num_classes: int,
    lrs: tuple[float, ...] = DEFAULT_LRS,
    weight_decays: tuple[float, ...] = DEFAULT_WEIGHT_DECAYS,
    holdout: float = 0.1,
    max_epochs: int = 100,
    patience: int = 10,
    batch_size: int = 256,
    chunk: int = 65536,
    seed: int = 0,
) -> ProbeResult:
    """Train a softmax-regression head for every (lr, weight decay) of the grid at once (SGD with
    Nesterov momentum 0.9 on standardised features), choose by the held-out accuracy, and score the
    chosen head on ``val``.

    ``holdout``: fraction of the training images held out (class-stratified, seeded; all views of an
    image on the same side) to choose the head and to stop. Each head keeps its weights of its best
    held-out accuracy (ties: lower held-out loss); the head with the best accuracy is chosen (ties:
    lower loss). Training ends when no head's held-out loss has improved by 0.1 % for ``patience``
    epochs, or after ``max_epochs``. Features
    are read ``chunk`` rows at a time (a multiple of ``batch_size``: the result does not depend on
    it), so memory stays bounded for cached features.
    """
    check_grid(list(lrs), list(weight_decays))
    check_training(max_epochs, patience, holdout)
    if chunk % batch_size:
        raise ConfigError(f"probe chunk {chunk} must be a multiple of the batch size {batch_size}")
    return _train_heads(
        train, val, num_classes, lrs, weight_decays, holdout, max_epochs, patience, batch_size, chunk, seed
    )


def _train_heads(
    train: FeatureStore,
    val: FeatureStore,
    num_classes: int,
    lrs: tuple[float, ...],
    weight_decays: tuple[float, ...],
    holdout: float,
    max_epochs: int,
    patience: int,
    batch_size: int = 256,
    chunk: int = 65536,
    seed: int = 0,
    progress: bool = False,
) -> ProbeResult:
    """``train_probe`` on settings checked already; ``progress``: show the epochs' progress on stderr."""
    generator = np.random.default_rng(seed)
    fit_rows, held_rows = holdout_rows(train, holdout, num_classes, generator)
    mean, std = feature_moments(train, fit_rows, chunk)
    torch.manual_seed(seed)
    heads = _Heads([(lr, wd) for lr in lrs for wd in weight_decays], mean.numel() + 1, num_classes)
    plateau = LossPlateau(len(heads.grid), patience)
    best_epoch = 0
    with Progress(max_epochs, "linear probe: training the heads", "epochs", progress) as shown:
        for epoch in range(1, max_epochs + 1):
            order = generator.permutation(fit_rows)
            for feats, labels in train.chunks(order, chunk):  # a chunk is read once, in random order
                for start in range(0, len(labels), batch_size):
                    x = _standardised(feats[start : start + batch_size], mean, std)
                    heads.step(x, labels[start : start + batch_size])
            held, _, held_loss = _evaluate(train, held_rows, heads.weight, mean, std, chunk)
            if heads.keep_best(held, held_loss):
                best_epoch = epoch
            shown.update(1)
            if plateau.reached(held_loss):
                break
    return heads.result(val, mean, std, chunk, best_epoch)


def holdout_rows(
    train: FeatureStore, holdout: float, num_classes: int, generator: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(rows trained on, rows held out) of ``train``: a class-stratified ``holdout`` fraction of its images
    held out, by image (the other augmented views of a held-out image must not be trained on); a held-out
    image's row is its first view, the evaluation view when the views are augmented.

    Raises:
        ConfigError: no image can be held out (or none trained on), naming ``probe.holdout``.
    """
    images = len(train) // train.views
    fit_images, held_images = _stratified_split(np.asarray(train.labels[:images]), holdout, generator)
    if len(held_images) == 0 or len(fit_images) == 0:
        raise ConfigError(
            f"the probe chooses its head on held-out training images, and {images} training images "
            f"({images / max(1, num_classes):.1f} per class) leave none to hold out at "
            f"probe.holdout={holdout}: a class needs 2 or more images (use more labelled images, or the kNN "
            "evaluation, mae knn)"
        )
    return (fit_images[None] + images * np.arange(train.views)[:, None]).ravel(), held_images


class LossPlateau:
    """The probes' stop: reached once no head's held-out loss has improved on its lowest by 0.1 % for
    ``patience`` epochs in a row."""

    def __init__(self, heads: int, patience: int) -> None:
        self.lowest = torch.full((heads,), math.inf)
        self.patience, self.stale = patience, 0

    def reached(self, held_loss: torch.Tensor) -> bool:
        """Take an epoch's held-out losses (heads,); whether training should stop now."""
        self.stale = 0 if (held_loss < self.lowest * 0.999).any() else self.stale + 1
        self.lowest = torch.minimum(self.lowest, held_loss)
        return self.stale >= self.patience


class _Heads:
    """The softmax-regression heads of a grid of (lr, weight decay), trained together: ``weight`` (H, D + 1,
    K), the last row the bias, by SGD with Nesterov momentum 0.9; each keeps its weights of its best
    held-out accuracy (ties: lower held-out loss)."""

    def __init__(self, grid: list[tuple[float, float]], width: int, num_classes: int) -> None:
        self.grid = grid
        self.lr = torch.tensor([lr for lr, _ in grid]).view(-1, 1, 1)
        self.wd = torch.tensor([wd for _, wd in grid]).view(-1, 1, 1)
        self.weight = torch.zeros(len(grid), width, num_classes)
        self.velocity = torch.zeros_like(self.weight)
        self.best_acc = torch.full((len(grid),), -1.0)  # each head's best held-out accuracy,
        self.best_loss = torch.full((len(grid),), math.inf)  # its held-out loss then (the tie-break)
        self.best_weight = self.weight.clone()

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One step of every head on standardised features ``x`` (n, D + 1) with labels ``y`` (n,)."""
        heads, num_classes = self.weight.shape[0], self.weight.shape[-1]
        weight = self.weight.requires_grad_(True)
        logits = torch.einsum("nd,hdk->hnk", x, weight)
        loss = F.cross_entropy(logits.reshape(-1, num_classes), y.repeat(heads), reduction="sum") / len(y)
        (grad,) = torch.autograd.grad(loss, weight)
        weight = weight.detach()
        grad[:, :-1] += self.wd * weight[:, :-1]  # no decay on the bias
        self.velocity.mul_(0.9).add_(grad)
        weight -= self.lr * (grad + 0.9 * self.velocity)
        self.weight = weight

    def keep_best(self, held: torch.Tensor, held_loss: torch.Tensor) -> bool:
        """Keep each head's weights where its held-out accuracy ``held`` (H,) improved; whether the head
        chosen now (``choose_head``) improved."""
        improved = (held > self.best_acc) | ((held == self.best_acc) & (held_loss < self.best_loss))
        self.best_weight[improved] = self.weight[improved]
        self.best_acc = torch.where(improved, held, self.best_acc)
        self.best_loss = torch.where(improved, held_loss, self.best_loss)
        return bool(improved[choose_head(self.best_acc, self.best_loss)])

    def result(
        self, val: FeatureStore, mean: torch.Tensor, std: torch.Tensor, chunk: int, epochs: int
    ) -> ProbeResult:
        """The chosen head's settings and accuracies, scored on ``val``, after ``epochs`` epochs."""
        choice = choose_head(self.best_acc, self.best_loss)
        chosen = self.best_weight[choice : choice + 1]
        top1, top5, _ = _evaluate(val, np.arange(len(val)), chosen, mean, std, chunk)
        grid = [
            {"lr": lr, "weight_decay": wd, "holdout_acc1": float(acc)}
            for (lr, wd), acc in zip(self.grid, self.best_acc, strict=True)
        ]
        lr, wd = self.grid[choice]
        return ProbeResult(lr, wd, epochs, float(self.best_acc[choice]), float(top1[0]), float(top5[0]), grid)


def _stratified_split(
    labels: np.ndarray, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    labels = np.asarray(labels)
    held = []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        held.append(
            members[: max(1, math.floor(fraction * len(members)))] if len(members) > 1 else members[:0]
        )
    held = np.sort(np.concatenate(held))
    return np.setdiff1d(np.arange(len(labels)), held), held


def feature_moments(store: FeatureStore, rows: np.ndarray, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, standard deviation) (D,) each of ``store``'s features over ``rows`` (read ``chunk`` at a time),
    the deviation at least 1e-6."""
    total = total_sq = None
    for feats, _ in store.chunks(rows, chunk):
        feats = feats.double()
        total = feats.sum(0) if total is None else total + feats.sum(0)
        total_sq = (feats**2).sum(0) if total_sq is None else total_sq + (feats**2).sum(0)
    mean = total / len(rows)
    std = (total_sq / len(rows) - mean**2).clamp(min=0).sqrt()
    return mean.float(), std.float().clamp(min=1e-6)


def _standardised(feats: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    x = (feats.float() - mean) / std
    return torch.cat([x, torch.ones(len(x), 1)], dim=1)  # the constant input of the bias


def choose_head(accuracy: torch.Tensor, loss: torch.Tensor) -> int:
    """The head with the best held-out accuracy; among equals, the lowest held-out loss."""
    best = accuracy == accuracy.max()
    return int(torch.where(best, loss, torch.full_like(loss, math.inf)).argmin())


@torch.no_grad()
def _evaluate(store, rows, weight, mean, std, chunk) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top-1 %, top-5 %, mean cross-entropy) of every head on ``rows``, (H,) each."""
    heads, num_classes = len(weight), weight.shape[-1]
    correct1, correct5, loss = torch.zeros(heads), torch.zeros(heads), torch.zeros(heads)
    for feats, labels in store.chunks(rows, chunk):
        logits = torch.einsum("nd,hdk->hnk", _standardised(feats, mean, std), weight)
        correct1 += (logits.argmax(-1) == labels).float().sum(1)
        correct5 += (
            (logits.topk(min(5, num_classes), dim=-1).indices == labels[:, None]).any(-1).float().sum(1)
        )
        loss += F.cross_entropy(
            logits.permute(1, 2, 0), labels[:, None].expand(-1, heads), reduction="none"
        ).sum(0)
    count = max(len(rows), 1)
    return 100 * correct1 / count, 100 * correct5 / count, loss / count
