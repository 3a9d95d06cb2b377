"""``mae finetune --ema.decay``: the weight EMA through the command line, against timm's ``ModelEmaV3``
applied by hand to the live weights of the same steps; resumed exactly; exported on request."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from timm.utils import ModelEmaV3
from torch import nn

from mae.training.callbacks.ema import EMA_WEIGHTS_KEY
from tests.helpers import TINY_KWARGS, csv_logger, read_metrics, run_mae, write_image_folder

DECAY = 0.9


def _config(tmp: Path, name: str, epochs: int = 2, **ema) -> dict:
    """A tiny classifier from scratch: 8 images in batches of 2, accumulated by 2 (2 optimizer steps per
    epoch), a checkpoint after every step; nothing random in the data or the training step."""
    return {
        "seed_everything": 0,
        "model": {
            "encoder": {"model": "mae_vit_tiny_patch4", "model_kwargs": TINY_KWARGS},
            "optim": {"warmup_epochs": 0, "base_lr": 0.05},
            "mixup": 0,
            "cutmix": 0,
        },
        "data": {
            "class_path": "mae.data.ImageFolderDataModule",
            "init_args": {
                "root": str(tmp / "data"),
                "img_size": 16,
                "batch_size": 2,
                "num_workers": 0,
                "augmentation": "none",
            },
        },
        "trainer": {
            "max_epochs": epochs,
            "accelerator": "cpu",
            "devices": 1,
            "accumulate_grad_batches": 2,
            "enable_progress_bar": False,
            "num_sanity_val_steps": 0,
            "log_every_n_steps": 1,
            "logger": csv_logger(tmp, name),
        },
        "checkpoint": {
            "monitor": None,
            "save_top_k": -1,
            "every_n_train_steps": 1,
            "every_n_epochs": None,
            "filename": "step_{step}",
            "auto_insert_metric_name": False,
        },
        "ema": ema,
    }


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ema")
    write_image_folder(tmp / "data" / "train", ["a", "b"], per_class=4)
    write_image_folder(tmp / "data" / "val", ["a", "b"], per_class=2, seed=1)
    return tmp


class _Weights(nn.Module):
    """A state dict as a module (float tensors as parameters, others as buffers, named by position), for
    timm's EMA to average by hand."""

    def __init__(self, state: dict[str, torch.Tensor]):
        super().__init__()
        for i, tensor in enumerate(state.values()):
            if tensor.is_floating_point():
                self.register_parameter(f"t{i}", nn.Parameter(tensor.clone(), requires_grad=False))
            else:
                self.register_buffer(f"t{i}", tensor.clone())


def _live(ckpt: Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt, weights_only=False)["state_dict"]
    return {k.removeprefix("vit."): v for k, v in state.items() if k.startswith("vit.")}


def _ema(ckpt: Path) -> dict:
    return torch.load(ckpt, weights_only=False)["callbacks"]["EMA"]


def _by_hand(start: dict[str, torch.Tensor] | None, live: list[dict], first_step: int) -> dict:
    """timm's ModelEmaV3 at ``DECAY`` from ``start`` (None: the first live weights), updated with each of
    ``live`` at steps ``first_step``, ``first_step + 1``, ..."""
    reference = ModelEmaV3(_Weights(start if start is not None else live[0]), decay=DECAY)
    for step, state in enumerate(live, first_step):
        reference.update(_Weights(state), step=step)
    names = list(live[0])
    return {names[int(key[1:])]: tensor for key, tensor in reference.module.state_dict().items()}


def _assert_equal(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for key in actual:
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=0, msg=key)


@pytest.fixture(scope="module")
def ema_run(data):
    run_mae("finetune", config=_config(data, "ema", decay=DECAY), tmp=data)
    return data / "runs" / "ema" / "version_0"


def test_ema__logged_beside_the_live_accuracy_and_equal_to_timms_ema_by_hand(ema_run):
    rows = read_metrics(ema_run)
    assert [r["val/acc1_ema"] for r in rows if r.get("val/acc1_ema")] and all(
        r.get("val/acc5_ema") for r in rows if r.get("val/acc1_ema")
    )
    checkpoints = [ema_run / "checkpoints" / f"step_{step}.ckpt" for step in (1, 2, 3, 4)]
    state = _ema(checkpoints[-1])
    assert state["step"] == 4 and state["decay"] == DECAY
    live = [_live(ckpt) for ckpt in checkpoints]
    # one update per optimizer step (every 2 batches), the first a copy of the weights
    _assert_equal(state[EMA_WEIGHTS_KEY], _by_hand(None, live, first_step=1))
    assert not torch.equal(state[EMA_WEIGHTS_KEY]["head.weight"], live[-1]["head.weight"])


@pytest.fixture(scope="module")
def plain_run(data):
    run_mae("finetune", config=_config(data, "plain", epochs=1), tmp=data)
    return data / "runs" / "plain" / "version_0"


def test_ema__off_by_default(plain_run):
    assert "EMA" not in torch.load(plain_run / "checkpoints" / "step_2.ckpt", weights_only=False)["callbacks"]
    assert not any(r.get("val/acc1_ema") for r in read_metrics(plain_run))


def test_ema__resume_continues_the_saved_average_exactly(ema_run, data):
    """Resumed from the end of the first epoch, the run ends with the uninterrupted run's EMA, which is the
    saved average updated by hand with the resumed run's own weights."""
    halfway = ema_run / "checkpoints" / "step_2.ckpt"
    uninterrupted = _ema(ema_run / "checkpoints" / "step_4.ckpt")
    run_mae("finetune", "--ckpt_path", str(halfway), config=_config(data, "ema", decay=DECAY), tmp=data)
    checkpoints = ema_run / "checkpoints"
    resumed = _ema(checkpoints / "step_4.ckpt")
    assert resumed["step"] == 4
    live = [_live(checkpoints / f"step_{step}.ckpt") for step in (3, 4)]
    _assert_equal(resumed[EMA_WEIGHTS_KEY], uninterrupted[EMA_WEIGHTS_KEY])
    _assert_equal(resumed[EMA_WEIGHTS_KEY], _by_hand(_ema(halfway)[EMA_WEIGHTS_KEY], live, first_step=3))


def test_ema__bad_decay_is_refused_at_start_up(data):
    result = run_mae("finetune", "--ema.decay", "1.5", config=_config(data, "bad"), tmp=data, check=False)
    assert result.returncode == 2
    assert "error: ema.decay must be in (0, 1), e.g. 0.9999, or null (off); got 1.5" in result.stderr
    assert not (data / "runs" / "bad").exists()


def test_export__ema_weights_on_request_not_the_live_ones(ema_run, data):
    ckpt = ema_run / "checkpoints" / "step_2.ckpt"  # the resume test rewrites steps 3-4 only
    ema, live = _ema(ckpt)[EMA_WEIGHTS_KEY], _live(ckpt)
    run_mae("export", "--checkpoint", str(ckpt), "--out", str(data / "ema.safetensors"), "--ema")
    run_mae("export", "--checkpoint", str(ckpt), "--out", str(data / "live.safetensors"))
    exported, plain = load_file(data / "ema.safetensors"), load_file(data / "live.safetensors")
    _assert_equal(exported, {k: ema[k] for k in exported})
    _assert_equal(plain, {k: live[k] for k in plain})
    assert not torch.equal(exported["blocks.0.attn.qkv.weight"], plain["blocks.0.attn.qkv.weight"])


def test_export__ema_of_a_checkpoint_without_it_is_refused(plain_run, data):
    ckpt = plain_run / "checkpoints" / "step_2.ckpt"
    out = data / "none.safetensors"
    result = run_mae("export", "--checkpoint", str(ckpt), "--out", str(out), "--ema", check=False)
    assert result.returncode == 2
    assert f"error: {ckpt} holds no EMA weights (only runs with --ema.decay keep them)" in result.stderr
    assert not out.exists()
