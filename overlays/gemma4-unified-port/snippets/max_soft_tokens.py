def _get_max_soft_tokens(merged_kwargs):
    # overlay-manager's own helper for the ported gemma4_unified module (vLLM < 0.22.0 lacks it):
    # (the image max_soft_tokens the caller set, whether it was set at the top level of the kwargs).
    # Where the release defines its own further down the module, that definition replaces this one.
    top = merged_kwargs.get("max_soft_tokens")
    if top is not None:
        return top, True
    nested = merged_kwargs.get("images_kwargs")
    return (nested.get("max_soft_tokens") if hasattr(nested, "get") else None), False
