# overlay-manager's module-level names for the ported gemma4_unified module, which imports them from
# here (vLLM 0.20.0 has the tuple only as a local of Gemma4MultiModalProcessor._call_hf_processor and
# no helper). Where the release defines its own further down the module (0.22.0), those win.
_SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)


def _get_max_soft_tokens(merged_kwargs):
    # (the image max_soft_tokens the caller set, whether it was set at the top level of the kwargs)
    top = merged_kwargs.get("max_soft_tokens")
    if top is not None:
        return top, True
    nested = merged_kwargs.get("images_kwargs")
    return (nested.get("max_soft_tokens") if hasattr(nested, "get") else None), False
