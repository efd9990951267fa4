def _overlay_gemma4_per_layer_compat(text_config):
    """Make a transformers >= 5.15 heterogeneous Gemma4 text config readable the old way.

    The full-attention layers' per-layer values become the raw `global_head_dim` /
    `num_global_key_value_heads` attributes again (as in config.json), and global
    reads of `head_dim` / `num_key_value_heads` return the sliding-layer values.
    Homogeneous (pre-5.15) configs are left alone.
    """
    if not getattr(text_config, "is_heterogeneous", False):
        return text_config
    per_layer = text_config.per_layer_config
    layer_types = list(getattr(text_config, "layer_types", None) or [])
    full = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    if full:
        if not getattr(text_config, "global_head_dim", None):
            text_config.global_head_dim = per_layer[full[0]].head_dim
        if not getattr(text_config, "num_global_key_value_heads", None):
            text_config.num_global_key_value_heads = per_layer[full[0]].num_key_value_heads
    text_config.allow_global_per_layer_attribute_access = True
    return text_config
