"""The local page (``mae demo``, Gradio): the reconstruction tab and its server (``demo``), the
"Similar images" tab (``search``)."""
