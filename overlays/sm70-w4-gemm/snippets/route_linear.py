from vllm.model_executor.layers.quantization import sm70_w4_route

sm70_scheme = sm70_w4_route.linear_scheme(self, weight_quant, input_quant)
if sm70_scheme is not None:
    return sm70_scheme
