"""The ``timm`` target: the encoder as timm's hub folder with a model card (``mae.convert.folders``; the
format: ``mae.convert.formats.timm_folder``), which ``timm.create_model("local-dir:DIR", pretrained=True)``
builds."""

from mae.convert.exports.base import ExportRequest, ExportTarget
from mae.convert.folders import FolderExport, export_folder, folder_lines, folder_outputs


def export(request: ExportRequest) -> FolderExport:
    return export_folder(
        request.checkpoint, request.out, "timm", request.checkpoint_format, num_heads=request.num_heads
    )


def describe(export: FolderExport) -> list[str]:
    return folder_lines(
        export, f'load with timm: timm.create_model("local-dir:{export.folder}", pretrained=True)'
    )


TARGET = ExportTarget(
    name="timm",
    suffix=None,
    options={},
    applies="--to timm only",
    outputs=folder_outputs,
    export=export,
    describe=describe,
)
