"""Reading image files: formats, the pixel limit, the array reader and the RGB reader."""
