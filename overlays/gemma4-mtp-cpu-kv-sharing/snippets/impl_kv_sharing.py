# The CPU attention backend writes K/V inside its impl's forward unless the impl itself was built
# with a kv_sharing_target_layer_name; the line above sets it on the layer only, after the layer
# (and its impl) was constructed. Without this, the drafter's Q-only layers write their
# uninitialised dummy K/V into the target layer's cache slots and change the target's tokens.
if getattr(attn, "impl", None) is not None:
    attn.impl.kv_sharing_target_layer_name = target_layer_name
