"""The pretrained encoder beyond classification: dense-prediction backbones (a ViTDet feature
pyramid that torchvision's detectors take as it is)."""
