"""Engines' binaries: the CUDA architecture audit (`fatbin` reader, Gemma-4 component `needs`, the `audit`)."""
