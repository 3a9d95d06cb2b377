"""Export targets, one module each: ``safetensors`` (a plain timm ViT file), ``onnx`` (an ONNX file checked
with onnxruntime), ``timm`` (timm's hub folder) and ``huggingface`` (a transformers ViTMAE folder). Each
module's ``TARGET`` is one row of ``mae.convert.exports.targets.EXPORT_TARGETS``, the table ``mae export``
consults; ``base`` holds the row's type."""
