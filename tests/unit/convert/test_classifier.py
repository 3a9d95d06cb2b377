"""``mae.convert.classifier``: what classifier a fine-tuned checkpoint holds (class count, pooling, a linear
probe's head) and its head as one linear layer, the same logits as the BatchNorm + linear it replaces."""

from pathlib import Path

import pytest
import torch

from mae.convert.classifier import Classifier, classifier_of, linear_head
from mae.convert.sources import read_checkpoint
from tests.helpers import finetune_module, tiny_pretraining_checkpoint


def classifier_checkpoint(tmp_path: Path, name: str = "ft", **module_kwargs) -> tuple[Path, torch.nn.Module]:
    """``tmp/<name>.ckpt``: our Lightning checkpoint of a seeded ``mae finetune`` module (3 classes, 16x16),
    its norms and (for a linear probe) its BatchNorm statistics drawn away from their initial values so that
    loading mistakes show; returns it and the module's classifier (evaluation mode)."""
    module = finetune_module(**module_kwargs)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in module.vit.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.copy_(1 + 0.1 * torch.randn(m.weight.shape, generator=generator))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=generator))
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=generator))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=generator))
            if isinstance(m, torch.nn.Linear) and m.out_features == 3:  # the head
                m.weight.copy_(torch.randn(m.weight.shape, generator=generator))
    path = tmp_path / f"{name}.ckpt"
    torch.save(
        {
            "state_dict": module.state_dict(),
            "pytorch-lightning_version": "2.6.6",
            "mae_architecture": module.architecture_record(),
        },
        path,
    )
    return path, module.vit.eval()


PROBE = dict(mode="linprobe", mixup=0.0, cutmix=0.0, drop_path_rate=0.0, global_pool="token")


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, Classifier(3, "avg", probe=False)),
        ({"global_pool": "token"}, Classifier(3, "token", probe=False)),
        (PROBE, Classifier(3, "token", probe=True)),
    ],
)
def test_classifier_of__class_count_pooling_and_probe_head_of_a_finetuned_checkpoint(
    tmp_path, kwargs, expected
):
    path, _ = classifier_checkpoint(tmp_path, **kwargs)
    assert classifier_of(read_checkpoint(path)) == expected


def test_classifier_of__a_pretraining_checkpoint_holds_none(tmp_path):
    assert classifier_of(read_checkpoint(tiny_pretraining_checkpoint(tmp_path))) is None


def test_linear_head__a_linear_probes_batchnorm_folded_gives_the_same_logits(tmp_path):
    path, probe = classifier_checkpoint(tmp_path, **PROBE)
    state = linear_head(read_checkpoint(path).encoder_state_dict())
    assert not any(key.startswith(("head.0.", "head.1.")) for key in state)
    features = torch.randn(5, probe.head[1].in_features)
    with torch.no_grad():
        ours = probe.head(features)
    folded = features @ state["head.weight"].T + state["head.bias"]
    assert (ours - folded).abs().max() <= 1e-5 and ours.abs().max() > 1  # the fold matters


def test_linear_head__a_linear_head_is_kept_as_it_is(tmp_path):
    path, _ = classifier_checkpoint(tmp_path)
    state = read_checkpoint(path).encoder_state_dict()
    folded = linear_head(state)
    assert folded.keys() == state.keys() and all(torch.equal(folded[k], v) for k, v in state.items())
