"""The settings groups several Lightning modules share, each read by LightningCLI as nested keys:
``model.optim`` (the optimiser and its warmup + cosine schedule), ``model.kernels`` (the kernel choices)
and ``model.teacher`` (the frozen teacher of feature targets and distillation), and, for the modules
trained on a pretrained encoder, ``model.encoder`` (``mae.training.transfer.EncoderSource``).

Each group is a frozen dataclass checked when built; a module's parameter of that type, with an
instance as default, gives the group that task's defaults. Its hyperparameters record each group as a
plain dict, which the module takes back (``as_group``) when Lightning rebuilds it.

Until 0.3.0 these settings were flat keys (``model.base_lr``, ...), until 0.4.0 the dense tasks named
activation checkpointing ``model.activation_checkpointing``, and until 0.5.0 pretraining chose its target
with ``model.norm_pix_loss`` (now ``model.target``, its values translated: ``RENAMED_VALUES``): ``RENAMES``
is the one table of the renamed keys, by release, and ``MOVES`` its sibling of the moved modules (whose
classes a config names). An old key is refused naming its new one (``renamed_key_error``), in a config or a
Python call (``refuse_renamed_arguments``), and the hyperparameters of a checkpoint written before the
rename are translated (``upgrade_hparams``).
"""

import inspect
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from typing import Any, Literal, TypeVar

from mae.compat.lightning import INSTANTIATOR_KEY, allow_instantiator
from mae.errors import ConfigError
from mae.training.optim import check_schedule_settings
from mae.training.runtime import TrainingSettings

# Each config key renamed, old -> new, under the release that renamed it. A module refuses an old key only
# where it takes the new one.
RENAMES = {
    "0.3.0": {
        "model.base_lr": "model.optim.base_lr",
        "model.lr": "model.optim.lr",
        "model.min_lr": "model.optim.min_lr",
        "model.warmup_epochs": "model.optim.warmup_epochs",
        "model.weight_decay": "model.optim.weight_decay",
        "model.betas": "model.optim.betas",
        "model.attention": "model.kernels.attention",
        "model.compile": "model.kernels.compile",
        "model.fused_adamw": "model.kernels.fused_adamw",
        "model.checkpoint": "model.encoder.checkpoint",
        "model.checkpoint_format": "model.encoder.checkpoint_format",
        "model.model": "model.encoder.model",
        "model.model_kwargs": "model.encoder.model_kwargs",
    },
    "0.4.0": {"model.activation_checkpointing": "model.grad_checkpointing"},
    "0.5.0": {"model.norm_pix_loss": "model.target"},
}
# The renamed keys whose values changed too: old key -> {old value: new value}.
RENAMED_VALUES: dict[str, dict[Any, Any]] = {"model.norm_pix_loss": {True: "norm_pix", False: "pixel"}}
RENAMED_KEYS = {old: new for renames in RENAMES.values() for old, new in renames.items()}  # every release's
RENAMED_IN = {old: release for release, renames in RENAMES.items() for old in renames}  # old -> its release

# Each module moved, old -> its new module (or, split, the new modules its names went to, in order), under
# the release that moved it (0.2.0's old paths imported with a warning until 0.3.0 removed them). A config
# naming a class of an old module (``class_path: mae.dense.detection_data.DigitScenesDataModule``) is refused
# naming the class's new path (``mae.cli.moved_classes``).
MOVES: dict[str, dict[str, tuple[str, ...]]] = {
    "0.2.0": {
        "mae.eval.visualize": ("mae.inference.reconstruction",),
        "mae.eval.attention": ("mae.inference.attention",),
        "mae.eval.own_images": (
            "mae.inference.normalization",
            "mae.inference.images",
            "mae.inference.reconstruction",
            "mae.apps.reconstruction_figure",
        ),
        "mae.eval.demo_page": ("mae.apps.page.demo", "mae.inference.images"),
        "mae.eval.search_page": ("mae.apps.page.search",),
        "mae.eval.embedder": ("mae.apps.embeddings.embedder",),
        "mae.eval.embed_run": ("mae.apps.embeddings.embed_run", "mae.inference.images"),
        "mae.eval.embedding_index": ("mae.apps.embeddings.embedding_index",),
        "mae.eval.similarity": ("mae.apps.embeddings.similarity",),
        "mae.eval.image_search": ("mae.apps.embeddings.image_search",),
        "mae.eval.neighbours_figure": ("mae.apps.embeddings.neighbours_figure",),
        "mae.eval.onnx_encoder": ("mae.apps.onnx_encoder",),
        "mae.eval.anomaly": ("mae.apps.anomaly",),
        **{
            f"mae.eval.anomaly.{name}": (f"mae.apps.anomaly.{name}",)
            for name in ("baseline", "digits", "evaluation", "figures", "layout", "masks", "metrics")
            + ("scoring",)
        },
        "mae.dense.pyramid": ("mae.dense.models.pyramid",),
        "mae.dense.windows": ("mae.dense.models.windows",),
        "mae.dense.upernet": ("mae.dense.models.upernet",),
        "mae.dense.coco": ("mae.dense.data.coco",),
        "mae.dense.detection_data": ("mae.dense.data.detection",),
        "mae.dense.segmentation_data": ("mae.dense.data.segmentation",),
        "mae.dense.detection_metrics": ("mae.dense.metrics.detection",),
        "mae.dense.segmentation_metrics": ("mae.dense.metrics.segmentation",),
        "mae.dense.module": ("mae.dense.tasks.base",),
        "mae.dense.detection": ("mae.dense.tasks.detection", "mae.dense.models.detectors"),
        "mae.dense.segmentation": ("mae.dense.tasks.segmentation", "mae.dense.models.segmenter"),
        "mae.dense.figures": ("mae.dense.tasks.figures",),
        "mae.dense.scenes": ("mae.data.sources.digit_scenes",),
        "mae.dense.scene_images": ("mae.data.sources.scene_images",),
    },
    "0.4.0": {
        "mae.command": ("mae.cli.command",),
        "mae.command_options": ("mae.cli.command_options",),
        "mae.apps.onnx_encoder": ("mae.convert.onnx_encoder",),
        "mae.convert.timm_folder": ("mae.convert.formats.timm_folder",),
        "mae.apps.anomaly.methods": ("mae.apps.anomaly.scorers",),
        "mae.cli.anomaly_checks": ("mae.apps.anomaly.scorers",),
    },
}
MOVED_MODULES = {old: new for moves in MOVES.values() for old, new in moves.items()}  # every release's
MOVED_IN = {old: release for release, moves in MOVES.items() for old in moves}  # old module -> its release


def moved_module(class_path: str) -> str | None:
    """The module of ``MOVED_MODULES`` that ``class_path`` (``package.module.Class``) names a class of, if
    it does."""
    module = class_path.rpartition(".")[0]
    return module if module in MOVED_MODULES else None


def present_modules(old: str) -> list[str]:
    """Where the names of the moved module ``old`` are now: its new modules, each followed through the later
    releases' moves (``mae.eval.onnx_encoder`` -> ``mae.apps.onnx_encoder`` -> ``mae.convert.onnx_encoder``).
    """
    found = []
    for new in MOVED_MODULES[old]:
        for module in present_modules(new) if new in MOVED_MODULES else [new]:
            if module not in found:
                found.append(module)
    return found


def check_setting(name: str, value: Any, allowed: tuple) -> None:
    """Raises ConfigError naming ``model.<name>`` when ``value`` is not one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(f"model.{name} must be one of {', '.join(map(str, allowed))}; got {value!r}")


@dataclass(frozen=True)
class OptimSettings:
    """``model.optim``: the learning rate (``base_lr`` per 256 images, so lr = ``base_lr`` x effective batch
    / 256, or ``lr`` directly), its linear warmup over ``warmup_epochs`` (fractional) epochs and cosine to
    ``min_lr``, and the weight decay (on weights, not on biases and norms); checked when built. The
    defaults are fine-tuning's (the paper's ViT-B); each module states its task's."""

    base_lr: float = 5e-4
    lr: float | None = None
    min_lr: float = 1e-6
    warmup_epochs: float = 5.0
    weight_decay: float = 0.05

    def __post_init__(self) -> None:
        check_schedule_settings(self.base_lr, self.lr, self.min_lr, self.warmup_epochs)


@dataclass(frozen=True)
class PretrainOptimSettings(OptimSettings):
    """``model.optim`` of pretraining: as ``OptimSettings`` (the paper's pretraining defaults), the
    ``optimizer`` ("adamw", the MAE paper's; "lamb", SparK's: ``mae.training.optim.PRETRAIN_OPTIMIZERS``)
    and its ``betas``."""

    base_lr: float = 1.5e-4
    min_lr: float = 0.0
    warmup_epochs: float = 40.0
    betas: tuple[float, float] = (0.9, 0.95)
    optimizer: Literal["adamw", "lamb"] = "adamw"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "betas", tuple(self.betas))  # a list from YAML or a checkpoint
        check_setting("optim.optimizer", self.optimizer, ("adamw", "lamb"))


@dataclass(frozen=True)
class KernelChoices:
    """``model.kernels``: ``attention`` ("sdpa" or "explicit"), ``compile`` (``torch.compile`` the network)
    and ``fused_adamw`` (the single-kernel AdamW), each "auto" (what ``mae.training.runtime`` measured for
    the device, precision and run length) or a value; checked when built."""

    attention: Literal["auto", "sdpa", "explicit"] = "auto"
    compile: bool | Literal["auto"] = "auto"
    fused_adamw: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        check_setting("kernels.attention", self.attention, ("auto", "sdpa", "explicit"))
        check_setting("kernels.compile", self.compile, (True, False, "auto"))
        check_setting("kernels.fused_adamw", self.fused_adamw, (True, False, "auto"))

    def resolve(self, measured: TrainingSettings) -> TrainingSettings:
        """The ``measured`` settings with every choice that is not "auto" put in."""
        chosen = asdict(self)
        return TrainingSettings(
            precision=measured.precision,
            **{name: getattr(measured, name) if value == "auto" else value for name, value in chosen.items()},
        )


@dataclass(frozen=True)
class TeacherSettings:
    """``model.teacher``: the frozen encoder whose tokens a run regresses (``model.target features``; see
    ``mae.training.teacher``): its ``checkpoint`` (any encoder ``mae.load_backbone`` reads: ours, official
    MAE, timm or Hugging Face files and folders, our exports; None: no teacher), the checkpoint's ``format``
    ("auto" or a name of ``mae.convert.sources.FORMATS``), the ``block`` whose output tokens are the targets
    (0-based, negative from the end: -1 the last) and whether each token is ``normalize``d (a LayerNorm
    without affine over its channels, as data2vec and MILAN do); checked when built."""

    checkpoint: str | None = None
    format: str = "auto"
    block: int = -1
    normalize: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.block, bool) or not isinstance(self.block, int):
            raise ConfigError(f"model.teacher.block must be an integer block index, got {self.block!r}")
        if not isinstance(self.normalize, bool):
            raise ConfigError(f"model.teacher.normalize must be true or false, got {self.normalize!r}")


# Each module's defaults: the paper's pretraining and fine-tuning; the kernels "auto", but no compiling
# for the transfers (shorter runs).
PRETRAIN_OPTIM = PretrainOptimSettings()
FINETUNE_OPTIM = OptimSettings()
AUTO_KERNELS = KernelChoices()
TRANSFER_KERNELS = KernelChoices(compile=False)
NO_TEACHER = TeacherSettings()

Group = TypeVar("Group")


def as_group(value: Group | dict[str, Any], default: Group) -> Group:
    """``value`` as a group of ``default``'s type: itself, or a dict of some of its fields (as hyperparameters
    record it, or a Python caller passes it) over ``default``, the module's own defaults.

    Raises:
        ConfigError: a key that is not one of the group's fields.
    """
    if isinstance(value, type(default)):
        return value
    known = {f.name for f in fields(default)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ConfigError(
            f"{type(default).__name__} takes {', '.join(sorted(known))}; got {', '.join(unknown)}"
        )
    return replace(default, **value)


def plain(group: Any) -> dict[str, Any]:
    """A group's fields as plain values (tuples as lists), as a YAML file or LightningCLI records them."""
    return {name: list(value) if isinstance(value, tuple) else value for name, value in asdict(group).items()}


def renamed_key_error(old: str) -> ConfigError:
    """The error for the old key ``old`` (a key of ``RENAMED_KEYS``)."""
    new = RENAMED_KEYS[old]
    values = RENAMED_VALUES.get(old)
    if values:  # the new key's value for each old one
        old_key, new_key = old.rpartition(".")[2], new.rpartition(".")[2]
        said = ", ".join(
            f"{old_key} {_yaml(before)} is {new_key} {after}" for before, after in values.items()
        )
        return ConfigError(f"{old} was moved to {new} in {RENAMED_IN[old]}: set {new} instead ({said})")
    return ConfigError(f"{old} was moved to {new} in {RENAMED_IN[old]}: set {new} instead")


def _yaml(value: Any) -> str:
    """``value`` as a YAML file spells it (true, false, ...)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def refuse_renamed_arguments(arguments: dict[str, Any], owner: type) -> None:
    """Stop a Python call of ``owner`` (a module, or a network that takes a module's key) that passes an
    argument under an old name: the keyword arguments ``arguments`` it did not take by name.

    Raises:
        ConfigError: naming the old key and the new one (``renamed_key_error``).
    """
    for old in renamed_for(owner):
        if old.removeprefix("model.") in arguments:
            raise renamed_key_error(old)


def group_fields(module_class: type) -> dict[str, set[str]]:
    """The groups ``module_class`` takes, by ``__init__`` parameter name (its own or a base's), with the
    field names of each (e.g. ``{"optim": {"base_lr", ...}, "kernels": {...}}``)."""
    groups: dict[str, set[str]] = {}
    for cls in module_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        for name, parameter in inspect.signature(init).parameters.items():
            if (
                name not in groups
                and isinstance(parameter.annotation, type)
                and is_dataclass(parameter.annotation)
            ):
                groups[name] = {f.name for f in fields(parameter.annotation)}
    return groups


def renamed_for(module_class: type) -> dict[str, str]:
    """The rows of ``RENAMED_KEYS`` that apply to ``module_class``: those whose new key it takes, in a group
    or by name (pretraining keeps its own ``model.model``, which transfer modules moved to
    ``model.encoder.model``)."""
    groups = group_fields(module_class)
    taken = {name for cls in module_class.__mro__ for name in _own_parameters(cls)}
    rows = {}
    for old, new in RENAMED_KEYS.items():
        _, *path = new.split(".")
        if path[-1] in (groups.get(path[0], ()) if len(path) == 2 else taken):
            rows[old] = new
    return rows


def _own_parameters(cls: type) -> list[str]:
    """The names of the parameters ``cls``'s own ``__init__`` takes (none when it defines none)."""
    init = cls.__dict__.get("__init__")
    return [] if init is None else list(inspect.signature(init).parameters)


def upgrade_hparams(hparams: dict[str, Any], renamed: dict[str, str]) -> dict[str, Any]:
    """``hparams`` of a checkpoint written before a rename (0.3.0's flat keys, 0.4.0's
    ``activation_checkpointing``) with each key of ``renamed`` (rows of ``RENAMED_KEYS``) moved to its new
    name, in its group, its value translated where ``RENAMED_VALUES`` says (0.5.0's ``norm_pix_loss`` true
    -> ``target`` norm_pix); a value the new key already holds is kept, but for 0.4.0's top-level rename:
    0.3.0's dense modules took both ``activation_checkpointing`` and ``grad_checkpointing`` and checkpointed
    when either was true, so a true under either name stays true. Other keys stay."""
    upgraded = dict(hparams)
    for old, new in renamed.items():
        key = old.removeprefix("model.")
        if key in upgraded:
            _, *path = new.split(".")
            value = upgraded.pop(key)
            if old in RENAMED_VALUES:
                upgraded.setdefault(path[-1], RENAMED_VALUES[old][bool(value)])
            elif len(path) == 1:
                upgraded[path[0]] = bool(upgraded.get(path[0])) or bool(value)
            else:
                upgraded[path[0]] = {path[1]: value, **(upgraded.get(path[0]) or {})}
    return upgraded


def instantiate_upgraded(module_class: type, hparams: dict[str, Any]) -> Any:
    """``module_class(**hparams)`` with the renamed keys moved to their new names: the instantiator
    ``settings_kwargs_v0_2`` names for Lightning's ``load_from_checkpoint``."""
    return module_class(**upgrade_hparams(hparams, renamed_for(module_class)))


allow_instantiator(f"{__name__}.{instantiate_upgraded.__name__}")

# The rows every module takes, whatever its class: the optimiser's and the kernels' keys.
_SHARED_ROWS = {old: new for old, new in RENAMED_KEYS.items() if new.split(".")[1] in ("optim", "kernels")}
# The rows renamed to a key of the module itself (model.norm_pix_loss -> model.target), not into a group.
_TOP_LEVEL_ROWS = {old: new for old, new in RENAMED_KEYS.items() if new.count(".") == 1}


def settings_kwargs_v0_2(hparams: dict[str, Any]) -> dict[str, Any]:
    """What ``load_from_checkpoint`` needs to rebuild a module from the hyperparameters ``hparams`` of a
    checkpoint written before a rename (before 0.3.0 the settings were flat keys; before 0.4.0 a dense
    module took ``activation_checkpointing``): the optimiser and kernel groups, and an instantiator
    (``instantiate_upgraded``) that also moves a transfer's encoder keys and the other renamed keys, and
    leaves out the old keys. Empty when ``hparams`` holds none of the old keys."""
    if not any(f"model.{key}" in RENAMED_KEYS for key in hparams if key not in ("model", "model_kwargs")):
        return {}  # pretraining keeps model and model_kwargs: alone they are not old keys
    moved = upgrade_hparams(hparams, _SHARED_ROWS)
    groups = {group: moved[group] for group in ("optim", "kernels") if group in moved}
    # Lightning keeps only the keys a module's __init__ takes before it calls the instantiator, so a key
    # renamed at the top level (norm_pix_loss -> target) is handed over under its new name here.
    renamed = {old: new for old, new in _TOP_LEVEL_ROWS.items() if old.removeprefix("model.") in hparams}
    upgraded = upgrade_hparams(hparams, renamed)
    top_level = {new.removeprefix("model."): upgraded[new.removeprefix("model.")] for new in renamed.values()}
    return {**groups, **top_level, INSTANTIATOR_KEY: f"{__name__}.{instantiate_upgraded.__name__}"}
