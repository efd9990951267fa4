if self.head_size == 512 and output_scale is None:
    from vllm.v1.attention.backends.sm70_d512_attn import sm70_d512_forward

    if sm70_d512_forward(self, query, key_cache, value_cache, output, attn_metadata):
        return output
