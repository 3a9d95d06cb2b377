"""Checkpoints in and out: every supported format read into one layout (``sources.read_checkpoint`` over
the table of ``formats/``, one module a format; ``safe_load``), their architecture records
(``architecture``), loading an MAE or an encoder (``backbone``), the export targets (``exports/``, one
module a target: safetensors via ``export``, ONNX via ``onnx_encoder`` and ``onnx``, timm and Hugging Face
folders via ``folders``), the Hugging Face weight names (``huggingface``) and load reports (``report``)."""
