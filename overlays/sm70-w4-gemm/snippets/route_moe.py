if isinstance(layer, FusedMoE):
    from vllm.model_executor.layers.quantization import sm70_w4_route

    sm70_method = sm70_w4_route.moe_method(self, layer, prefix)
    if sm70_method is not None:
        return sm70_method
