"""The classifier a fine-tuned checkpoint holds (``mae finetune``, fine-tuning or linear probing): its class
count, its pooling and its head as one linear layer, as the timm and Hugging Face folder exports write it.

A fine-tuned encoder pools in one of two ways (``pooling_of``): "avg", the mean of the
patch tokens through ``fc_norm`` (the paper's fine-tuning; no final ``norm``), or "token", the cls token
after the final ``norm``. Its head is a linear layer (``head.weight``, ``head.bias``), or for a linear probe
a BatchNorm without affine parameters before it (``head.0.*``, ``head.1.*``), which in evaluation is an
affine map and folds into the linear layer (``linear_head``).

A joint checkpoint (``mae finetune`` mode joint, ``mae.training.joint``) is an MAE that holds such a
classifier too: ``fc_norm`` and ``head`` pool "avg", beside the final ``norm`` its MAE (and any feature
reader) reads; the classifier leaves that norm aside (``linear_head``).
"""

from dataclasses import dataclass

import torch

from mae.convert.checkpoint import MAECheckpoint

# eps of the linear probe's BatchNorm1d before its head (``mae.training.finetune``).
PROBE_NORM_EPS = 1e-6
_PROBE_KEYS = ("head.0.running_mean", "head.0.running_var", "head.1.weight", "head.1.bias")


@dataclass(frozen=True)
class Classifier:
    """What a checkpoint's classifier is: ``num_classes`` outputs, ``global_pool`` ("avg" or "token", see
    the module doc) and ``probe``: whether its head is a linear probe's (BatchNorm, then linear)."""

    num_classes: int
    global_pool: str
    probe: bool

    @property
    def described(self) -> str:
        """In words: "a 10-class classifier (global average pooling)"."""
        pool = "global average pooling" if self.global_pool == "avg" else "the cls token"
        return f"a {self.num_classes}-class classifier ({pool})"


def pooling_of(ckpt: MAECheckpoint) -> str:
    """The ``global_pool`` of the classifier ``ckpt`` holds, which loads its ``fc_norm``: "avg" for an
    encoder fine-tuned with global average pooling (an ``fc_norm``; no final ``norm``, or a joint
    checkpoint's, which is its MAE's), else "token". Feature users that keep neither norm (the dense
    pyramid) load either kind of checkpoint this way."""
    return "avg" if "fc_norm.weight" in ckpt.encoder_state_dict() else "token"


def classifier_of(ckpt: MAECheckpoint) -> Classifier | None:
    """The classifier ``ckpt`` holds; None for an encoder without a head (pretraining, an exported
    encoder)."""
    state = ckpt.state_dict
    if "head.weight" in state:
        return Classifier(state["head.weight"].shape[0], pooling_of(ckpt), probe=False)
    if all(key in state for key in _PROBE_KEYS):
        return Classifier(state["head.1.weight"].shape[0], pooling_of(ckpt), probe=True)
    return None


def linear_head(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (a classifier's encoder state dict) as the timm classifier of ``classifier_of`` holds it:
    its head as one linear layer (a linear probe's BatchNorm (evaluation mode: running statistics) folded
    into the linear layer after it, ``W' = W / s``, ``b' = b - W' mean`` with ``s = sqrt(var + eps)``; any
    other head as it is), and without the final ``norm`` of a joint checkpoint, which pools through
    ``fc_norm`` (the norm is its MAE's: timm's average-pooling classifier has none)."""
    if "fc_norm.weight" in state:
        state = {k: v for k, v in state.items() if not k.startswith("norm.")}
    if "head.1.weight" not in state:
        return dict(state)
    weight, bias = state["head.1.weight"].double(), state["head.1.bias"].double()
    scale = (state["head.0.running_var"].double() + PROBE_NORM_EPS).sqrt()
    folded = weight / scale  # (K, D): each input feature's column divided by its spread
    dtype = state["head.1.weight"].dtype
    head = {
        "head.weight": folded.to(dtype),
        "head.bias": (bias - folded @ state["head.0.running_mean"].double()).to(dtype),
    }
    return {**{k: v for k, v in state.items() if not k.startswith("head.")}, **head}
