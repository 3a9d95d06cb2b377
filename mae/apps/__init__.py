"""Applications of a trained model, each behind one command (``mae.cli``): reconstructions of your own
images as a figure (``reconstruction_figure``), the local page with its reconstruction and similar-image
tabs (``page``), embeddings and similar-image search (``embeddings``) and anomaly maps (``anomaly``); the
encoder's ONNX file is an export target (``mae.convert.onnx_encoder``). They measure nothing for training:
that is ``mae.eval``."""
