"""Semantic segmentation metrics from one confusion matrix summed over batches and processes:
mean IoU, pixel accuracy and mean class accuracy, as mmsegmentation reports them (mIoU, aAcc, mAcc)."""

import torch
from torchmetrics.classification import MulticlassConfusionMatrix

from mae.errors import ConfigError


class SegmentationMetrics(MulticlassConfusionMatrix):
    """mIoU, pixel accuracy and mean class accuracy over the pixels whose target is not ``ignore_index``.

    The state is torchmetrics' (num_classes, num_classes) confusion matrix (rows: target, columns:
    prediction), summed across processes when computed, so the result under DDP equals the
    single-process one when every image is seen once (``SegmentationDataModule``'s validation sampler).

    Conventions (mmsegmentation's): a class's IoU is TP / (TP + FP + FN) over the whole split, not per
    image; a class absent from both the targets and the predictions has no IoU (NaN) and is left out of
    the mean (``nanmean``), while a class only predicted, or only in the targets, counts with IoU 0. The
    same for class accuracy, TP / (TP + FN), NaN for a class absent from the targets.

    Use: ``update(preds, target)`` per batch with ``preds`` (N, K, H, W) logits or (N, H, W) labels and
    ``target`` (N, H, W) int64 labels of the same size; at the epoch's end ``log_dict(compute())`` and
    ``reset()``.

    Args:
        num_classes: K.
        ignore_index: target value of pixels left out.
        class_names: names for the per-class keys; the class index otherwise.
        per_class: also return each class's IoU, as ``{prefix}iou/{name}`` (NaN when absent from both).
        prefix: the keys' prefix.
        **kwargs: ``torchmetrics.Metric``'s (``sync_on_compute``, ...).

    Raises:
        ValueError: from ``update``, for shapes that do not match or labels that are no class.
    """

    def __init__(
        self,
        num_classes: int,
        ignore_index: int = 255,
        class_names: list[str] | None = None,
        per_class: bool = False,
        prefix: str = "val/",
        **kwargs,
    ) -> None:
        # torchmetrics' own validation counts distinct values without checking their range; ``update`` checks.
        super().__init__(num_classes, ignore_index=ignore_index, validate_args=False, **kwargs)
        if class_names is not None and len(class_names) != num_classes:
            raise ConfigError(f"{len(class_names)} class names for num_classes={num_classes}")
        self.class_names = class_names or [str(i) for i in range(num_classes)]
        self.per_class = per_class
        self.prefix = prefix

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add a batch: ``preds`` (N, K, H, W) logits or (N, H, W) labels, ``target`` (N, H, W) labels."""
        k = self.num_classes
        logits = preds.dim() == target.dim() + 1
        label_shape = preds.shape[:1] + preds.shape[2:] if logits else preds.shape
        if label_shape != target.shape or (logits and preds.shape[1] != k):
            raise ConfigError(
                f"predictions {tuple(preds.shape)} do not match targets {tuple(target.shape)}: "
                f"(N, {k}, H, W) logits or (N, H, W) labels for (N, H, W) targets"
            )
        self._check_labels("target", target, self.ignore_index)
        if not logits:
            self._check_labels("predicted", preds, None)
        super().update(preds, target)

    def _check_labels(self, name: str, labels: torch.Tensor, ignore_index: int | None) -> None:
        outside = (labels < 0) | (labels >= self.num_classes)
        if ignore_index is not None:
            outside &= labels != ignore_index
        if outside.any():
            also = f" (nor ignore_index={ignore_index})" if ignore_index is not None else ""
            raise ConfigError(
                f"{name} labels {labels[outside].unique()[:10].tolist()} are no class of "
                f"num_classes={self.num_classes}{also}"
            )

    def class_iou(self) -> torch.Tensor:
        """(K,) float64 IoU of each class, NaN for a class absent from both targets and predictions."""
        confmat = self.confmat.double()
        true_positives = confmat.diagonal()
        union = confmat.sum(0) + confmat.sum(1) - true_positives
        return true_positives / union  # 0 / 0 = NaN

    def compute(self) -> dict[str, torch.Tensor]:
        """``{prefix}miou``, ``{prefix}acc`` (pixel accuracy), ``{prefix}macc`` (mean class accuracy), all
        in [0, 1], and with ``per_class`` each class's IoU: float32 scalars (NaN before any pixel)."""
        confmat = self.confmat.double()
        iou = self.class_iou()
        results = {
            f"{self.prefix}miou": iou.nanmean(),
            f"{self.prefix}acc": confmat.diagonal().sum() / confmat.sum(),
            f"{self.prefix}macc": (confmat.diagonal() / confmat.sum(1)).nanmean(),
        }
        if self.per_class:
            results.update(
                {f"{self.prefix}iou/{name}": v for name, v in zip(self.class_names, iou, strict=True)}
            )
        return {key: value.float() for key, value in results.items()}
