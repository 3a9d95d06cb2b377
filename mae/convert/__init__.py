"""Checkpoints in and out: reading every supported format (ours, official MAE, timm, Hugging Face;
``sources``, ``safe_load``), their architecture records, loading an MAE or an encoder (``backbone``),
exporting a plain timm encoder (``export``) or an ONNX file (``onnx``), Hugging Face layout
(``huggingface``) and load reports (``report``)."""
