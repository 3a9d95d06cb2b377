"""k-nearest-neighbour classification on frozen features: a fast check of a representation.

Cosine similarity, the k most similar training images vote with weight ``exp(sim / temperature)``.
References: Wu et al., "Unsupervised Feature Learning via Non-Parametric Instance Discrimination"
(2018); the weighted kNN protocol popularised by DINO (Caron et al., 2021).
"""

from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import DataLoader

from mae.data.datamodules import ImageDataModule


@torch.no_grad()
def extract_features(
    encode: Callable[[torch.Tensor], torch.Tensor], loader: DataLoader, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``encode`` ((N, C, H, W) -> (N, D)) over ``loader``: (features (M, D) L2-normalised, labels (M,))."""
    feats, labels = [], []
    for imgs, targets in loader:
        out = encode(imgs.to(device)).float()
        feats.append(torch.nn.functional.normalize(out, dim=1).cpu())
        labels.append(targets.cpu())
    return torch.cat(feats), torch.cat(labels)


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
    train: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor], num_classes: int,
    k: int = 20, temperature: float = 0.07,
) -> tuple[float, float]:  # fmt: skip
    """(top-1, top-5) accuracy in percent of kNN on (features, labels) pairs."""
    scores = knn_classify(train[0], train[1], test[0], num_classes, k, temperature)
    top = scores.topk(min(5, num_classes), dim=1).indices
    labels = test[1].unsqueeze(1)
    return (100.0 * (top[:, :1] == labels).any(1).float().mean().item(),
            100.0 * (top == labels).any(1).float().mean().item())  # fmt: skip


def cls_features(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The normed cls token of an MAE model or a timm ViT, on all patches (no masking)."""
    return lambda imgs: model.forward_features(imgs)[:, 0]


class KNNCallback(pl.Callback):
    """Every ``every_n_epochs`` epochs, log ``val/knn_acc1`` / ``val/knn_acc5`` of the encoder's cls token.

    Uses the data module's training split as the memory bank and its validation split as queries,
    both with the evaluation transform. Runs on global rank 0 only.
    """

    def __init__(self, every_n_epochs: int = 10, k: int = 20, temperature: float = 0.07, max_train: int = 50_000):
        if every_n_epochs < 0 or k < 1 or temperature <= 0:
            raise ValueError(
                f"need every_n_epochs >= 0, k >= 1, temperature > 0; got {every_n_epochs}, {k}, {temperature}"
            )
        self.every_n_epochs, self.k, self.temperature, self.max_train = every_n_epochs, k, temperature, max_train

    @rank_zero_only
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch = trainer.current_epoch + 1
        if not self.every_n_epochs or (epoch % self.every_n_epochs and epoch != trainer.max_epochs):
            return
        datamodule = trainer.datamodule
        train_set, val_set = datamodule.feature_datasets()
        if val_set is None:
            return
        if len(train_set) > self.max_train:  # a fixed subset, drawn without touching the global RNG
            keep = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(0))[: self.max_train]
            train_set = torch.utils.data.Subset(train_set, keep.tolist())
        model = pl_module.model
        was_training = model.training
        model.eval()
        loader = lambda ds: DataLoader(ds, batch_size=datamodule.batch_size, num_workers=datamodule.num_workers)  # noqa: E731
        encode = cls_features(model)
        # Loaders draw seeds from the global RNG: fork it, so monitoring never changes the training run.
        with torch.random.fork_rng(devices=[pl_module.device] if pl_module.device.type == "cuda" else []):
            acc1, acc5 = knn_accuracy(
                extract_features(encode, loader(train_set), pl_module.device),
                extract_features(encode, loader(val_set), pl_module.device),
                datamodule.num_labels, self.k, self.temperature,
            )  # fmt: skip
        model.train(was_training)
        pl_module.log_dict({"val/knn_acc1": acc1, "val/knn_acc5": acc5}, rank_zero_only=True)


def main(
    checkpoint: Path,
    data: ImageDataModule,
    k: int = 20,
    temperature: float = 0.07,
    checkpoint_format: str = "auto",
    device: str = "cpu",
) -> tuple[float, float]:
    """kNN accuracy of a pretrained encoder: ``python -m mae.knn --checkpoint CKPT --data.class_path ...``.

    Args:
        checkpoint: any source ``mae.load_backbone`` reads.
        data: a data module (e.g. ``mae.data.DigitsDataModule``); its train split is the memory bank.
        k: neighbours.
        temperature: vote temperature.
        checkpoint_format: "auto" or a format name.
        device: where to run the encoder.
    """
    from mae.backbone import load_backbone

    backbone = load_backbone(checkpoint, img_size=data.img_size, format=checkpoint_format).to(device).eval()
    train_set, val_set = data.feature_datasets()
    if val_set is None:
        raise ValueError("kNN evaluation needs a validation split in the data module")
    loader = lambda ds: DataLoader(ds, batch_size=data.batch_size, num_workers=data.num_workers)  # noqa: E731
    encode = cls_features(backbone)
    acc1, acc5 = knn_accuracy(
        extract_features(encode, loader(train_set), device), extract_features(encode, loader(val_set), device),
        data.num_labels, k, temperature,
    )  # fmt: skip
    print(f"kNN (k={k}, T={temperature}) on {len(val_set)} validation images: top-1 {acc1:.2f}%, top-5 {acc5:.2f}%")
    return acc1, acc5


if __name__ == "__main__":
    from jsonargparse import CLI

    CLI(main, as_positional=False)
