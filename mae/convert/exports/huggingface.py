"""The ``huggingface`` target: a transformers ViTMAE folder with its image processor and a model card
(``mae.convert.folders``; the format: ``mae.convert.formats.huggingface``): ``ViTMAEForPreTraining`` when
the checkpoint has a decoder, else (or with ``--encoder-only``) ``ViTMAEModel``; a classifier fine-tuned
on the cls token (``mae finetune --model.global_pool token``) as ``ViTForImageClassification``. Its own
checks (transformers installed, a decoder, input size and pooling transformers has) and files are
``FOLDER``'s.

transformers' ViT classifies the cls token after its final LayerNorm and has no other pooling, so a
classifier fine-tuned with global average pooling (``mae finetune``'s default: the mean of the patch
tokens through ``fc_norm``, no final norm) is refused by name rather than exported as something that
computes other logits, or other features (``ViTMAEModel`` would apply a final norm the encoder never had):
``--to timm`` holds it."""

from pathlib import Path

from mae.convert.checkpoint import MAECheckpoint
from mae.convert.classifier import Classifier, classifier_of
from mae.convert.exports.base import ExportRequest, ExportTarget
from mae.convert.folders import (
    FolderContents,
    FolderExport,
    FolderFormat,
    check_request,
    export_folder,
    folder_lines,
    folder_outputs,
)
from mae.convert.formats import huggingface as hf_format
from mae.convert.huggingface import hf_config_of
from mae.convert.model_card import CardTarget
from mae.errors import ConfigError


def check(ckpt: MAECheckpoint, encoder_only: bool) -> bool:
    """Refuse what a transformers folder cannot hold; returns whether it holds the decoder (the
    checkpoint's, unless ``encoder_only``).

    Raises:
        ConfigError: transformers not installed; a classifier fine-tuned with global average pooling
            (the module's doc); a decoder or input size ``ViTMAEForPreTraining`` does not have
            (``hf_config_of``).
    """
    classifier = classifier_of(ckpt)
    if classifier is not None and classifier.global_pool == "avg":
        raise ConfigError(
            f"{ckpt.source} is {classifier.described}: Hugging Face transformers' ViT classifies the cls "
            "token after a final norm and has no average pooling, so no transformers folder computes this "
            "model's logits or features (it has an fc_norm after pooling, no final norm); export it with "
            "--to timm, which holds it (global_pool='avg')"
        )
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError(
            "a Hugging Face folder needs transformers for its image processor: "
            'pip install "transformers>=5.25"'
        ) from None
    decoder = ckpt.has_decoder and not encoder_only
    hf_config_of(ckpt.config, decoder)
    return decoder


def write(contents: FolderContents, folder: Path) -> None:
    """``config.json``, ``model.safetensors`` and ``preprocessor_config.json`` (the run's mask ratio, the
    mean and std) into ``folder``."""
    mask_ratio = contents.facts.hparams.get("mask_ratio", 0.75)
    config, decoder = contents.ckpt.config, contents.has_decoder
    classes = contents.classifier.num_classes if contents.classifier else None
    hf_format.write(contents.state, config, folder, decoder, mask_ratio, contents.mean, contents.std, classes)


def card_usage(folder_name: str, has_decoder: bool) -> list[str]:
    """The card's code: transformers loads the folder; the tokens of every patch, in raster order."""
    cls = "ViTMAEForPreTraining" if has_decoder else "ViTMAEModel"
    lines = [
        "import torch",
        f"from transformers import ViTImageProcessor, ViTMAEModel{', ' + cls if has_decoder else ''}",
        "",
        f'processor = ViTImageProcessor.from_pretrained("{folder_name}")  # or "<user>/<repo>"',
        "# every patch, in raster order: no masking, and noise that keeps the order",
        f'encoder = ViTMAEModel.from_pretrained("{folder_name}", mask_ratio=0.0)',
        'pixels = processor(images=image, return_tensors="pt")["pixel_values"]',
        "patches = encoder.embeddings.patch_embeddings.num_patches",
        "noise = torch.arange(patches, dtype=torch.float).expand(len(pixels), patches)",
        "tokens = encoder(pixel_values=pixels, noise=noise).last_hidden_state  # (N, 1 + patches, width)",
    ]
    if has_decoder:
        lines.append(f'mae = {cls}.from_pretrained("{folder_name}")  # reconstruction loss, logits, mask')
    return lines


def card_classifier_usage(folder_name: str, classifier: Classifier) -> list[str]:
    """The card's code for a classifier: transformers' ``ViTForImageClassification`` and its class scores."""
    return [
        "from transformers import ViTForImageClassification, ViTImageProcessor",
        "",
        f'processor = ViTImageProcessor.from_pretrained("{folder_name}")  # or "<user>/<repo>"',
        f'model = ViTForImageClassification.from_pretrained("{folder_name}").eval()',
        'pixels = processor(images=image, return_tensors="pt")["pixel_values"]',
        f"logits = model(pixel_values=pixels).logits  # (N, {classifier.num_classes}) class scores",
    ]


CARD = CardTarget(
    library="transformers",
    loaded_by="Hugging Face transformers",
    usage=card_usage,
    classifier_usage=card_classifier_usage,
)
FOLDER = FolderFormat(name="huggingface", check=check, write=write, card=CARD)


def export(request: ExportRequest) -> FolderExport:
    return export_folder(
        request.checkpoint,
        request.out,
        FOLDER,
        request.checkpoint_format,
        request.options.get("encoder_only", False),
        request.num_heads,
    )


def describe(export: FolderExport) -> list[str]:
    model_class = "ViTMAEForPreTraining" if export.has_decoder else "ViTMAEModel"
    if export.classifier is not None:
        model_class = "ViTForImageClassification"
    # ViTMAEModel masks 75 % of the patches unless told otherwise: the encoder's features need every patch.
    every_patch = ", mask_ratio=0.0" if model_class == "ViTMAEModel" else ""
    return folder_lines(
        export, f'load with transformers: {model_class}.from_pretrained("{export.folder}"{every_patch})'
    )


TARGET = ExportTarget(
    name="huggingface",
    suffix=None,
    options={"encoder_only": False},
    applies="--to huggingface only",
    outputs=folder_outputs,
    export=export,
    describe=describe,
    check=check_request,
)
