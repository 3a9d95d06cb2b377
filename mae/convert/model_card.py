"""The ``README.md`` model card of an exported folder: YAML front matter (licence, library, tags, datasets,
evaluation results as ``model-index``; written by ``huggingface_hub.ModelCard``) and a body, every fact
read from the checkpoint and the run folder beside it, nothing typed by the user.

What a card states, and where it comes from:

- architecture: the checkpoint's record (``mae_architecture``), or what its tensors show;
- recipe and config: the run's ``config.yaml`` (``runs/<name>/version_N/``, the folder above
  ``checkpoints/``), else the checkpoint's hyperparameters;
- epochs, optimizer steps and images seen: the checkpoint's loop state; images seen = optimizer steps
  x batch size x devices x nodes x gradient accumulation (training loaders drop the last partial batch);
- data: the data module and its settings (``config.yaml``), the normalisation (``mae_data``);
- evaluation results: the last kNN / linear-probe / fine-tuning accuracies in the run's ``metrics.csv``,
  with their protocol from ``config.yaml``;
- licence: CC BY-NC 4.0 when the run started from the official MAE weights (``model.init_from``).
"""

import csv
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mae.convert.classifier import Classifier
from mae.convert.families import family_of
from mae.convert.sharded_checkpoint import is_sharded_checkpoint, read_training_checkpoint
from mae.convert.sources import MAECheckpoint
from mae.models.targets import target_class, target_of

# The marker a card ``mae export`` wrote carries (an HTML comment: not shown on the hub).
CARD_MARK = "<!-- written by mae export"
OFFICIAL_LICENSE = "cc-by-nc-4.0"
CITATION = """@inproceedings{he2022masked,
  title     = {Masked Autoencoders Are Scalable Vision Learners},
  author    = {He, Kaiming and Chen, Xinlei and Xie, Saining and Li, Yanghao and Doll{\\'a}r, Piotr and
               Girshick, Ross},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR)},
  pages     = {16000--16009},
  year      = {2022}
}"""
# The papers of the CNN family's masked pretraining (SparK, ICLR 2023; ConvNeXt V2's FCMAE, CVPR 2023).
CNN_CITATION = """@inproceedings{tian2023designing,
  title     = {Designing BERT for Convolutional Networks: Sparse and Hierarchical Masked Modeling},
  author    = {Tian, Keyu and Jiang, Yi and Diao, Qishuai and Lin, Chen and Wang, Liwei and Yuan, Zehuan},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year      = {2023}
}
@inproceedings{woo2023convnext,
  title     = {ConvNeXt V2: Co-designing and Scaling ConvNets with Masked Autoencoders},
  author    = {Woo, Sanghyun and Debnath, Shoubhik and Hu, Ronghang and Chen, Xinlei and Liu, Zhuang and
               Kweon, In So and Xie, Saining},
  booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern Recognition (CVPR)},
  year      = {2023}
}"""
# metrics.csv column -> (evaluation, config.yaml section of its protocol, the factor to percent): the kNN and
# probe monitors log percent, the fine-tuning module's torchmetrics accuracies fractions.
_EVALUATIONS = {
    "val/knn_acc1": ("kNN top-1", "knn", 1),
    "val/knn_acc5": ("kNN top-5", "knn", 1),
    "val/probe_acc1": ("linear probe top-1", "probe", 1),
    "val/probe_acc5": ("linear probe top-5", "probe", 1),
    "val/acc1": ("fine-tuning top-1", "finetune", 100),
    "val/acc5": ("fine-tuning top-5", "finetune", 100),
}
# Names of the official MAE weight files and Hugging Face repositories (CC BY-NC 4.0).
_OFFICIAL_NAMES = re.compile(
    r"mae_(pretrain|visualize|finetuned)_vit_|facebook/vit-mae-|vit-mae-(base|large|huge)"
)


@dataclass
class Evaluation:
    """One accuracy the run folder holds: ``name`` ("kNN top-1"), ``value`` (%), the number of ``epochs``
    trained when it was measured, and its ``protocol`` in words."""

    name: str
    value: float
    epochs: int
    protocol: str


@dataclass
class RunFacts:
    """What a card states about the run that wrote a checkpoint (see the module doc for the sources)."""

    checkpoint: str
    format: str
    config: dict[str, Any]
    data: dict[str, Any] | None
    hparams: dict[str, Any] = field(default_factory=dict)
    run_folder: Path | None = None
    run_config: dict[str, Any] | None = None
    epochs: int | None = None
    steps: int | None = None
    images_seen: int | None = None
    evaluations: list[Evaluation] = field(default_factory=list)

    @property
    def init_from(self) -> str | None:
        """The weights the run started from: a pretraining run's ``model.init_from``, a fine-tuning run's
        ``model.encoder.checkpoint``."""
        model = (self.run_config or {}).get("model") or {}
        encoder = self.hparams.get("encoder") or model.get("encoder") or {}
        return self.hparams.get("init_from") or model.get("init_from") or encoder.get("checkpoint")

    @property
    def from_official_weights(self) -> bool:
        """Whether the run started from the official MAE weights (CC BY-NC 4.0)."""
        source = self.init_from
        if not source:
            return False
        encoder = self.hparams.get("encoder") or {}
        init_format = self.hparams.get("init_format") or encoder.get("checkpoint_format") or "auto"
        return init_format == "official" or bool(_OFFICIAL_NAMES.search(str(source)))


def read_run(ckpt: MAECheckpoint) -> RunFacts:
    """The facts of the run that wrote ``ckpt``: its Lightning state and, when the checkpoint sits in
    ``<run>/checkpoints/``, the run folder's ``config.yaml`` and ``metrics.csv``."""
    facts = RunFacts(ckpt.source, ckpt.format, dict(ckpt.config), ckpt.data)
    path = Path(ckpt.source)
    if ckpt.format != "lightning" or not (path.is_file() or is_sharded_checkpoint(path)):
        return facts
    obj = read_training_checkpoint(path, model_only=True)
    facts.hparams = dict(obj.get("hyper_parameters") or {})
    facts.steps = obj.get("global_step")
    progress = obj.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
    facts.epochs = progress.get("processed", obj.get("epoch"))
    if path.parent.name == "checkpoints" and (path.parent.parent / "config.yaml").is_file():
        attach_run_folder(facts, path.parent.parent)
    return facts


def attach_run_folder(facts: RunFacts, folder: Path, shown_as: Path | None = None) -> RunFacts:
    """``facts`` with the run folder ``folder``'s ``config.yaml`` and ``metrics.csv`` read in (the card
    names the folder ``shown_as``, where a recorded copy stands in for the run folder)."""
    facts.run_folder = shown_as or folder
    facts.run_config = yaml.safe_load((folder / "config.yaml").read_text()) or {}
    facts.images_seen = _images_seen(facts.steps, facts.run_config)
    facts.evaluations = _evaluations(folder / "metrics.csv", facts.run_config)
    return facts


def _images_seen(steps: int | None, run_config: dict[str, Any]) -> int | None:
    """Optimizer steps x batch size x devices x nodes x accumulation, or None when one of them is not
    known from ``config.yaml`` ("auto" devices on an accelerator, a batch size set elsewhere): not stated
    rather than guessed."""
    trainer = run_config.get("trainer") or {}
    batch = ((run_config.get("data") or {}).get("init_args") or {}).get("batch_size")
    devices = device_count(trainer.get("devices", 1), trainer.get("accelerator"))
    nodes, accumulation = trainer.get("num_nodes", 1), trainer.get("accumulate_grad_batches", 1)
    numbers = [_count(n) for n in (steps, batch, devices, nodes, accumulation)]
    if any(n is None for n in numbers):
        return None
    product = 1
    for n in numbers:
        product *= n
    return product


def device_count(devices: Any, accelerator: Any = None) -> int | None:
    """How many devices a run's ``trainer.devices`` (as ``config.yaml`` stores it) trained on: a count
    (``2``, or ``'2'`` as the command line's ``--trainer.devices 2`` is stored), a list of device ids
    (``[0, 1]``, ``'0,1'``), or ``'auto'`` on the CPU accelerator (one process); None when
    ``config.yaml`` does not say (``'auto'`` or ``-1`` on an accelerator: as many as the machine had)."""
    if isinstance(devices, list | tuple):
        return len(devices) or None
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto":
            return 1 if accelerator == "cpu" else None
        if "," in text:  # Lightning's device ids, "0,1" or "1,"
            ids = [part.strip() for part in text.split(",") if part.strip()]
            return len(ids) if ids and all(part.isdigit() for part in ids) else None
        devices = _count(text)
    count = _count(devices)
    return count if count is not None and count > 0 else None  # -1 (every device) and 0 say no count


def _count(value: Any) -> int | None:
    """An integer setting as ``config.yaml`` may store it (``4`` or ``'4'``); None for anything else."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _evaluations(metrics: Path, run_config: dict[str, Any]) -> list[Evaluation]:
    """The last value of each evaluation column of ``metrics``, with its protocol."""
    if not metrics.is_file():
        return []
    with open(metrics, newline="") as f:
        rows = list(csv.DictReader(f))
    found = []
    for column, (name, section, to_percent) in _EVALUATIONS.items():
        measured = [row for row in rows if row.get(column)]
        if measured:
            last = measured[-1]
            value = float(last[column]) * to_percent
            epochs = int(last["epoch"]) + 1  # metrics.csv counts epochs from 0
            found.append(Evaluation(name, value, epochs, _protocol(section, run_config)))
    return found


def _protocol(section: str, run_config: dict[str, Any]) -> str:
    settings = run_config.get(section) or {}
    data = _data_name(run_config)
    if section == "knn":
        return (
            f"weighted kNN (k={settings.get('k')}, temperature {settings.get('temperature')}) on the cls "
            f"token of the frozen encoder: training split of {data} as the memory bank (at most "
            f"{settings.get('max_train')} images), its validation split as queries"
        )
    if section == "probe":
        return (
            f"linear probe ({settings.get('pool')} pooling) on the frozen encoder's features, at most "
            f"{settings.get('max_epochs')} epochs, early stopping after {settings.get('patience')}; trained "
            f"on the training split of {data}, measured on its validation split"
        )
    mode = ((run_config.get("model") or {}).get("mode")) or "finetune"
    if mode == "linprobe":
        return (
            f"a linear head trained on the frozen encoder (linear probing) on the training split of {data}, "
            "measured on its validation split"
        )
    return f"the whole network fine-tuned on the training split of {data}, measured on its validation split"


def _data_name(run_config: dict[str, Any] | None) -> str:
    data = (run_config or {}).get("data") or {}
    name = str(data.get("class_path", "the training data")).rpartition(".")[2]
    root = (data.get("init_args") or {}).get("root")
    return f"{name} ({root})" if root else name


def card_license(facts: RunFacts) -> str:
    """The card's licence id: CC BY-NC 4.0 for weights initialised from the official MAE weights, else
    ``other`` (a run of the user's own: the licence is the owner's to state; the card says so)."""
    return OFFICIAL_LICENSE if facts.from_official_weights else "other"


@dataclass(frozen=True)
class CardTarget:
    """What a card says of the folder target it describes (``mae.convert.exports.timm.CARD``, ...):
    ``library`` (the card's ``library_name``, e.g. "transformers"), ``loaded_by`` (who loads the folder, in
    words: "Hugging Face transformers"), ``usage(folder_name, has_decoder)``: the lines of its code
    block, how to load the folder and compute the tokens, and ``classifier_usage(folder_name, classifier)``:
    those for a classifier's folder, how to compute its class scores."""

    library: str
    loaded_by: str
    usage: Callable[[str, bool], list[str]]
    classifier_usage: Callable[[str, Classifier], list[str]]


def model_card(
    facts: RunFacts,
    target: CardTarget,
    folder_name: str,
    has_decoder: bool,
    classifier: Classifier | None = None,
) -> str:
    """The card's text for an export of ``facts``' checkpoint to ``target`` in a folder named
    ``folder_name``; ``has_decoder``: the folder holds the decoder too; ``classifier``: the folder holds
    that fine-tuned classifier (the encoder and its head)."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    data_name = _data_name(facts.run_config) if facts.run_config else "unknown"
    library = target.library
    task = "image-classification" if classifier else "image-feature-extraction"
    results = [
        EvalResult(
            task_type="image-classification",
            dataset_type=data_name,
            dataset_name=data_name,
            dataset_split="validation",
            metric_type="accuracy",
            metric_name=e.name,
            metric_value=round(e.value, 2),
        )
        for e in facts.evaluations
    ]
    kind = "convolutional-network" if family_of(facts.config) == "cnn" else "vision-transformer"
    card_data = ModelCardData(
        license=card_license(facts),
        library_name=library,
        tags=[task, "masked-autoencoder", "mae", kind, library],
        pipeline_tag=task,
        datasets=[data_name] if facts.run_config else None,
        model_name=folder_name if results else None,
        eval_results=results or None,
    )
    body = _body(facts, target, folder_name, has_decoder, data_name, classifier)
    return str(ModelCard(f"---\n{card_data.to_yaml()}\n---\n{body}"))


def _body(
    facts: RunFacts,
    target: CardTarget,
    folder_name: str,
    has_decoder: bool,
    data_name: str,
    classifier: Classifier | None,
) -> str:
    c = facts.config
    size = c["img_size"] if isinstance(c["img_size"], int) else "x".join(str(s) for s in c["img_size"])
    what = "encoder and decoder (ViTMAEForPreTraining)" if has_decoder else "encoder"
    cnn = family_of(c) == "cnn"
    if cnn:
        about = (
            f"A convolutional network, timm's `{c['encoder']}`, pretrained by sparse masked image modelling "
            "(the masked cells of the input set to zero and kept at zero after every convolution, "
            "normalisation statistics over the visible cells only: SparK, Tian et al., 2023; ConvNeXt V2's "
            f"FCMAE, Woo et al., 2023) with the `mae` package; its encoder, the timm model itself, exported "
            f"for {target.loaded_by}."
        )
    elif classifier is None and _distilled(facts.hparams):
        about = (
            f"A Vision Transformer {what} distilled from a frozen teacher's attention relations (TinyMIM, "
            f"Ren et al., 2023) with `mae distill`, exported for {target.loaded_by}."
        )
    elif classifier is None:
        about = (
            f"A Vision Transformer {what} pretrained as a Masked Autoencoder (He et al., 2021) with the "
            f"`mae` package, exported for {target.loaded_by}."
        )
    else:
        about = (
            f"A Vision Transformer classifier, {classifier.described}, fine-tuned with the `mae` package "
            f"from an encoder pretrained as a Masked Autoencoder (He et al., 2021), exported for "
            f"{target.loaded_by}."
        )
    lines = [
        f"# {folder_name}",
        "",
        f"{CARD_MARK} from {facts.checkpoint} ({facts.format}) -->",
        "",
        about,
        "",
        "## Architecture",
        "",
        *(_cnn_architecture(c, size) if cnn else _vit_architecture(c, size)),
    ]
    if has_decoder and not cnn:
        lines += [
            f"Decoder: width {c['decoder_embed_dim']}, depth {c['decoder_depth']}, "
            f"{c['decoder_num_heads']} heads; target `{target_of(c)}`: the loss is the MSE on "
            f"{target_class(target_of(c)).described} of the masked patches.",
            "",
        ]
    lines += _teacher(c.get("target_options"))  # a features target's: the encoder was trained against it
    if classifier is not None:
        pooled = (
            "the mean of the patch tokens through its fc_norm"
            if classifier.global_pool == "avg"
            else "the cls token after the final norm"
        )
        lines += [f"Head: one linear layer to {classifier.num_classes} classes on {pooled}.", ""]
    lines += _recipe(facts)
    lines += _data(facts, data_name)
    lines += _results(facts)
    lines += _loading(target, folder_name, has_decoder, classifier, c.get("encoder") if cnn else None)
    lines += _licence(facts)
    lines += ["## Citation", "", "```bibtex", *([CNN_CITATION] if cnn else []), CITATION, "```", ""]
    return "\n".join(lines)


def _vit_architecture(c: dict[str, Any], size: str) -> list[str]:
    """The ViT's architecture table."""
    return [
        "| input | patch | channels | width | depth | heads | MLP ratio | LayerNorm eps |",
        "|---|---|---|---|---|---|---|---|",
        f"| {size} | {c['patch_size']} | {c['in_chans']} | {c['embed_dim']} | {c['depth']} "
        f"| {c['num_heads']} | {c['mlp_ratio']:g} | {c['layer_norm_eps']:g} |",
        "",
    ]


# The CNN family's decoders (``mae.models.cnn.decoders``), in words.
_CNN_DECODERS = {
    "spark": "SparK's light hierarchical decoder (mask tokens filled in at every scale, upsampled)",
    "fcmae": "FCMAE's ConvNeXt-V2 block decoder",
}


def _cnn_architecture(c: dict[str, Any], size: str) -> list[str]:
    """The CNN's architecture table and its pretraining decoder (not part of these weights)."""
    lines = [
        "| input | timm model | channels | mask unit | pretraining decoder | decoder width |",
        "|---|---|---|---|---|---|",
        f"| {size} | `{c['encoder']}` | {c['in_chans']} | {c.get('mask_unit', '-')} px "
        f"| {c.get('decoder', '-')} | {c.get('decoder_width', '-')} |",
        "",
    ]
    if "decoder" in c:
        target = target_of(c)
        lines += [
            f"Pretraining: {c.get('mask_unit')}-px cells masked, decoded by "
            f"{_CNN_DECODERS.get(c['decoder'], c['decoder'])} (width {c.get('decoder_width')}, not part of "
            f"these weights); the loss is the MSE on {target_class(target).described} of the masked cells.",
            "",
        ]
    return lines


def _cnn_usage(folder_name: str, encoder: str) -> list[str]:
    """The card's code for a CNN's timm folder: timm builds the network and computes its features."""
    return [
        "import timm",
        "",
        f'model = timm.create_model("local-dir:{folder_name}", pretrained=True).eval()  # hf-hub:USER/REPO',
        "config = timm.data.resolve_data_config({}, model=model)",
        "transform = timm.data.create_transform(**config)  # resize, centre crop, normalise as trained",
        "maps = model.forward_features(transform(image).unsqueeze(0))  # (1, C, H/32, W/32), the last stage",
        "embedding = model.forward_head(maps, pre_logits=True)  # (1, C): the mean of the map",
        "",
        f'# or timm alone by name: timm.create_model("{encoder}", num_classes=0) and load_state_dict of',
        f'# safetensors.torch.load_file("{folder_name}/model.safetensors"), strict',
    ]


def _teacher(options: dict[str, Any] | None) -> list[str]:
    """The lines naming the teacher of a ``features`` target (its identity, block and normalisation), from
    a model's ``target_options``; none without one."""
    t = (options or {}).get("teacher")
    if not t:
        return []
    normalised = "normalised per token (LayerNorm without affine)" if options.get("normalize") else "raw"
    return [
        f"Teacher (frozen, not part of these weights): `{t.get('path')}` ({t.get('format')}, sha256 "
        f"`{t.get('sha256')}`; width {t.get('embed_dim')}, depth {t.get('depth')}, {t.get('patch_size')}-px "
        f"patches); targets: the tokens of its block {options.get('block')}, {normalised}.",
        "",
    ]


def _distilled(hparams: dict[str, Any]) -> bool:
    """Whether a run's ``hparams`` are ``mae distill``'s (``mae.training.distill``): a student and its
    teacher's identity."""
    return "teacher_identity" in hparams and "student" in hparams


def _recipe(facts: RunFacts) -> list[str]:
    lines = ["## Training", ""]
    h = facts.hparams
    if "mode" in h:  # the fine-tuning module's
        encoder = (h.get("encoder") or {}).get("checkpoint")
        how = "Linear probing" if h["mode"] == "linprobe" else "Fine-tuning"
        lines.append(
            f"{how} of the encoder of `{encoder}`: "
            f"{h.get('global_pool')} pooling, mixup {h.get('mixup')}, cutmix {h.get('cutmix')}, label "
            f"smoothing {h.get('label_smoothing')}, drop path {h.get('drop_path_rate')}, layer decay "
            f"{h.get('layer_decay')}."
        )
    elif _distilled(h):
        t = h["teacher_identity"] or {}
        lines.append(
            f"Distilled (TinyMIM attention relations, `mae distill`) into a `{h.get('student')}` student "
            f"from the frozen teacher `{t.get('path')}` ({t.get('format')}, sha256 `{t.get('sha256')}`; "
            f"width {t.get('embed_dim')}, depth {t.get('depth')}, {t.get('num_heads')} heads), its block "
            f"{(h.get('teacher') or {}).get('block')} into the student's block {h.get('student_block')}."
        )
    elif h and family_of(facts.config) == "cnn":
        lines.append(
            f"Sparse masked pretraining of a CNN: mask ratio {h.get('mask_ratio')} "
            f"({h.get('mask_strategy')} masking), target `{target_of(h)}`, recipe model `{h.get('model')}`."
        )
    elif h:
        lines.append(
            f"MAE pretraining: mask ratio {h.get('mask_ratio')} ({h.get('mask_strategy')} masking), "
            f"target `{target_of(h)}`, recipe model `{h.get('model')}`."
        )
    counted = []
    if facts.epochs is not None:
        counted.append(f"{facts.epochs} epochs")
    if facts.steps is not None:
        counted.append(f"{facts.steps:,} optimizer steps")
    if facts.images_seen is not None:
        counted.append(
            f"{facts.images_seen:,} images seen (optimizer steps x batch size x devices x nodes x "
            "gradient accumulation)"
        )
    if counted:
        lines.append("Trained for " + ", ".join(counted) + ".")
    if facts.run_config:
        shown = {
            k: facts.run_config[k] for k in ("seed_everything", "model", "data") if k in facts.run_config
        }
        trainer = facts.run_config.get("trainer") or {}
        keys = ("max_epochs", "max_steps", "precision", "devices", "num_nodes", "accumulate_grad_batches")
        shown["trainer"] = {k: trainer[k] for k in keys if k in trainer}
        config = yaml.safe_dump(shown, sort_keys=False).rstrip()
        lines += ["", f"The run's configuration (`{facts.run_folder}/config.yaml`, in part):", "", "```yaml"]
        lines += [config, "```"]
    elif not h:
        lines.append(f"The checkpoint ({facts.format}) records no training run; only its weights are known.")
    return lines + [""]


def _data(facts: RunFacts, data_name: str) -> list[str]:
    lines = ["## Data", ""]
    if facts.run_config:
        lines.append(f"{'Fine-tuned' if 'mode' in facts.hparams else 'Pretrained'} on {data_name}.")
    if facts.data:
        d = facts.data
        lines.append(
            f"Inputs: {d['in_chans']} channels, {'x'.join(str(s) for s in d['img_size'])} pixels, values "
            f"scaled to [0, 1] (8-bit / 255, 16-bit / 65535), then normalised per channel with mean "
            f"{_numbers(d['mean'])} and std {_numbers(d['std'])}."
        )
    else:
        lines.append("The checkpoint records no normalisation; ImageNet's mean and std are assumed.")
    return lines + [""]


def _numbers(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"


def _results(facts: RunFacts) -> list[str]:
    lines = ["## Evaluation", ""]
    if not facts.evaluations:
        where = facts.run_folder or "beside the checkpoint"
        return lines + [
            f"No kNN, linear-probe or fine-tuning result was found in the run folder ({where}).",
            "",
        ]
    lines += ["| evaluation | accuracy (%) | after epochs | protocol |", "|---|---|---|---|"]
    for e in facts.evaluations:
        lines.append(f"| {e.name} | {e.value:.2f} | {e.epochs} | {e.protocol} |")
    lines += ["", f"The last of each in `{facts.run_folder}/metrics.csv`, measured while the run trained"]
    if facts.epochs is not None:
        lines[-1] += f"; this checkpoint holds the weights after {facts.epochs} epochs"
    return lines + [lines.pop() + ".", ""]


def _loading(
    target: CardTarget,
    folder_name: str,
    has_decoder: bool,
    classifier: Classifier | None,
    cnn_encoder: str | None = None,
) -> list[str]:
    if cnn_encoder is not None and classifier is None:
        usage = _cnn_usage(folder_name, cnn_encoder)
        load = f'backbone = mae.load_backbone("{folder_name}")  # the timm {cnn_encoder}'
    elif classifier is None:
        usage = target.usage(folder_name, has_decoder)
        load = f'backbone = mae.load_backbone("{folder_name}")  # a timm VisionTransformer'
    else:
        usage = target.classifier_usage(folder_name, classifier)
        load = (
            f'backbone = mae.load_backbone("{folder_name}", global_pool="{classifier.global_pool}")  # its '
            "encoder, a timm VisionTransformer"
        )
    lines = ["## Use", "", "```python", *usage, "```"]
    lines += [
        "",
        "With the `mae` package (features, fine-tuning):",
        "",
        "```python",
        "import mae",
        "",
        load,
        "```",
        "",
        f"`mae finetune --model.encoder.checkpoint {folder_name} ...` fine-tunes it.",
        "",
    ]
    return lines


def _licence(facts: RunFacts) -> list[str]:
    lines = ["## Licence", ""]
    if facts.from_official_weights:
        lines.append(
            f"This run started from the official MAE weights ({facts.init_from}), released by Meta under "
            "CC BY-NC 4.0 (non-commercial use only); these weights derive from them and carry that licence."
        )
    elif facts.init_from:
        lines.append(
            f"This run started from {facts.init_from}; its licence applies to these weights as well. "
            "Licence: not recorded by the run: state it in `license:` above before sharing."
        )
    else:
        lines.append(
            "Trained from scratch by this run: the licence is the owner's choice, not recorded by the run; "
            "state it in `license:` above before sharing."
        )
    return lines + [""]
