def get_total_num_kv_heads(self) -> int:
    _overlay_gemma4_per_layer_compat(self.hf_text_config)
    return super().get_total_num_kv_heads()
