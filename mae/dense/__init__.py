"""The pretrained encoder beyond classification: dense-prediction backbones (ViTDet's simple feature
pyramid, window attention), heads (UperNet), dense data (COCO, class-mask folders, the built-in digit
scenes), their metrics, and the detection and segmentation Lightning modules (``detect.py``,
``segment.py``)."""
