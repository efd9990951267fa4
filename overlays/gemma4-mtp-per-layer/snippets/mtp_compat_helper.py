def _overlay_gemma4_mtp_compat(config):
    """A transformers >= 5.15 heterogeneous Gemma4 text config, readable the way this module reads it.

    The full-attention layers' per-layer values become the raw `global_head_dim` /
    `num_global_key_value_heads` attributes again (as in the drafter's config.json), and global
    reads of `head_dim` / `num_key_value_heads` return the sliding-layer values. Homogeneous
    (pre-5.15) configs are returned unchanged.
    """
    if not getattr(config, "is_heterogeneous", False):
        return config
    per_layer = config.per_layer_config
    kinds = list(getattr(config, "layer_types", None) or [])
    full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
    if full:
        if not getattr(config, "global_head_dim", None):
            config.global_head_dim = per_layer[full[0]].head_dim
        if not getattr(config, "num_global_key_value_heads", None):
            config.num_global_key_value_heads = per_layer[full[0]].num_key_value_heads
    config.allow_global_per_layer_attribute_access = True
    return config
