def get_head_size(self) -> int:
    # the inherited getter reads `head_dim`; answer it as before transformers 5.15
    _overlay_gemma4_per_layer_compat(self.hf_text_config)
    return super().get_head_size()

def get_total_num_kv_heads(self) -> int:
    _overlay_gemma4_per_layer_compat(self.hf_text_config)
    return super().get_total_num_kv_heads()
