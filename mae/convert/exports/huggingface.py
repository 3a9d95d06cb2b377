"""The ``huggingface`` target: a transformers ViTMAE folder with its image processor and a model card
(``mae.convert.folders``; the format: ``mae.convert.formats.huggingface``): ``ViTMAEForPreTraining`` when
the checkpoint has a decoder, else (or with ``--encoder-only``) ``ViTMAEModel``."""

from mae.convert.exports.base import ExportRequest, ExportTarget
from mae.convert.folders import FolderExport, export_folder, folder_lines, folder_outputs


def export(request: ExportRequest) -> FolderExport:
    return export_folder(
        request.checkpoint,
        request.out,
        "huggingface",
        request.checkpoint_format,
        request.options.get("encoder_only", False),
        request.num_heads,
    )


def describe(export: FolderExport) -> list[str]:
    model_class = "ViTMAEForPreTraining" if export.has_decoder else "ViTMAEModel"
    return folder_lines(export, f'load with transformers: {model_class}.from_pretrained("{export.folder}")')


TARGET = ExportTarget(
    name="huggingface",
    suffix=None,
    options={"encoder_only": False},
    applies="--to huggingface only",
    outputs=folder_outputs,
    export=export,
    describe=describe,
)
