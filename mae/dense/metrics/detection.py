"""COCO mAP of detections (and instance masks): torchmetrics' ``MeanAveragePrecision`` on the pycocotools
backend (COCOeval itself), under our metric names, gathered correctly across processes.

Names (``prefix`` "val/" by default); each is COCO's AP averaged over categories, at most 100 detections
per image, all object sizes:

    map       box AP averaged over IoU thresholds 0.50:0.05:0.95 (COCO's primary metric)
    map_50    box AP at IoU 0.50 (PASCAL VOC's)
    map_75    box AP at IoU 0.75
    mask_map, mask_map_50, mask_map_75    the same for masks (with ``masks=True``)

A value of -1 means there was no ground truth to measure against (COCOeval's convention).
"""

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from mae.dense.data.coco import require_pycocotools

MASK_THRESHOLD = 0.5  # a Mask R-CNN mask probability above this is the object
METRICS = ("map", "map_50", "map_75")  # torchmetrics' names of the summary values reported


class DetectionMetrics(nn.Module):
    """Box (and mask) mAP over a validation epoch: ``update`` per batch, ``compute`` at the end, then
    ``reset``.

    Args:
        masks: also measure instance masks (``segm``).
        prefix: prepended to every name (module docstring).

    Under DDP every process updates with its own images; ``compute`` gathers them all (any number per
    process: each image must be measured exactly once, e.g. with Lightning's ``UnrepeatedDistributedSampler``)
    and returns the same values on every process. torchmetrics' own gathering of this metric needs the
    same number of images on every process (its per-image lists are gathered entry by entry), so it is
    turned off and replaced here.
    """

    def __init__(self, masks: bool = False, prefix: str = "val/") -> None:
        super().__init__()
        require_pycocotools()
        from pycocotools.cocoeval import Params
        from torchmetrics.detection import MeanAveragePrecision

        self.masks = masks
        self.prefix = prefix
        coco = Params(iouType="bbox")
        self.map = MeanAveragePrecision(
            box_format="xyxy",
            iou_type=("bbox", "segm") if masks else "bbox",
            backend="pycocotools",
            # COCOeval's own thresholds: torchmetrics' defaults come from a float32 linspace (recall 0.2 is
            # 0.19999999), so a recall of exactly k/n on a threshold lands on the other side of it
            iou_thresholds=coco.iouThrs.tolist(),
            rec_thresholds=coco.recThrs.tolist(),
            sync_on_compute=False,
        )

    def update(self, preds: list[dict[str, torch.Tensor]], targets: list[dict[str, Any]]) -> None:
        """Add one batch.

        Args:
            preds: per image, the detector's output: ``boxes`` (D, 4) xyxy in pixels, ``scores`` (D,),
                ``labels`` (D,), and with masks ``masks`` (D, 1, H, W) probabilities (Mask R-CNN's) or
                (D, H, W) booleans.
            targets: per image, ``boxes`` (K, 4) xyxy in pixels, ``labels`` (K,), optionally ``iscrowd``
                (K,) (crowd regions: detections there are neither right nor wrong), with masks ``masks``
                (K, H, W); other keys are ignored.
        """
        keys = ("boxes", "scores", "labels")
        preds = [
            {k: p[k] for k in keys} | ({"masks": _binary(p["masks"])} if self.masks else {}) for p in preds
        ]
        targets = [
            {k: t[k] for k in ("boxes", "labels", "iscrowd") if k in t}
            | ({"masks": t["masks"].bool()} if self.masks else {})
            for t in targets
        ]
        self.map.update(preds, targets)

    def compute(self) -> dict[str, torch.Tensor]:
        """The metrics (module docstring) over every image of every process, as 0-d tensors."""
        local = self.map.metric_state
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            for name, values in _gathered(local).items():
                setattr(self.map, name, values)
        try:
            result = self.map.compute()
        finally:
            for name, values in local.items():  # this process's images again, for a later update
                setattr(self.map, name, values)
        if not self.masks:  # one IoU type: torchmetrics' names carry no "bbox_"
            return {f"{self.prefix}{name}": result[name] for name in METRICS}
        return {
            f"{self.prefix}{stem}{name}": result[f"{kind}_{name}"]
            for kind, stem in (("bbox", ""), ("segm", "mask_"))
            for name in METRICS
        }

    def reset(self) -> None:
        self.map.reset()


def _binary(masks: torch.Tensor) -> torch.Tensor:
    """(D, H, W) bool of Mask R-CNN's (D, 1, H, W) probabilities, or of masks that are binary already."""
    if masks.dtype == torch.bool:
        return masks.squeeze(1) if masks.dim() == 4 else masks
    return (masks.squeeze(1) if masks.dim() == 4 else masks) > MASK_THRESHOLD


def _gathered(state: dict[str, list]) -> dict[str, list]:
    """Every process's per-image lists, concatenated in rank order (the lists may differ in length)."""
    # on the CPU: a pickled CUDA tensor would be loaded onto its sender's device;
    # COCOeval runs on the CPU anyway
    on_cpu = {
        name: [v.cpu() if isinstance(v, torch.Tensor) else v for v in values]
        for name, values in state.items()
    }
    everyone: list[dict[str, list] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, on_cpu)
    return {name: [v for rank in everyone for v in rank[name]] for name in state}
