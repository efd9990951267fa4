if output_scale is None:
    from vllm.v1.attention.backends.sm70_d512_attn import sm70_attention_forward

    if sm70_attention_forward(self, query, key_cache, value_cache, output, attn_metadata, layer):
        return output
