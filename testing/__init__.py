"""Test support shipped as library code: tiny checkpoints (checkpoints.py) and the real-engine harness (engine.py).

Nothing here is imported by the CLI; heavy packages (torch, transformers, tokenizers, safetensors) are imported
lazily inside the functions that need them.
"""
