if "embed_tokens_per_layer.weight_" in name or name.endswith("embed_tokens_per_layer.input_global_scale"):
    from vllm.model_executor.models import gemma4_ple_nvfp4

    ple_name = gemma4_ple_nvfp4.collect(name, loaded_weight, params_dict)
    if ple_name is not None:
        loaded_params.add(ple_name)
    continue
