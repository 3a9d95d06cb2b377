"""The recipes' views of decoded pixels: crop, RGB recipes, array views, GPU decoding, normalisation."""
