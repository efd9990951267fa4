# Compressed-tensors pack-quantized MoE experts (vLLM PR #40886): explode
# the fused 3-D _packed / _scale tensors into per-expert weight_packed /
# weight_scale keys. These must run before the float branch below, whose
# substring test also matches "moe.gate_up_proj_packed".
#   moe.gate_up_proj_packed [E, 2I, H/8] -> gate_proj / up_proj .weight_packed
#   moe.gate_up_proj_scale  [E, 2I, G]   -> gate_proj / up_proj .weight_scale
#   moe.down_proj_packed    [E, H, I/8]  -> down_proj.weight_packed
#   moe.down_proj_scale     [E, H, G]    -> down_proj.weight_scale
if "moe.gate_up_proj_packed" in name and weight.dim() == 3:
    intermediate_size = weight.size(1) // 2
    for expert_id in range(weight.size(0)):
        base = name.replace("moe.", f"moe.experts.{expert_id}.")
        yield (
            base.replace("gate_up_proj_packed", "gate_proj.weight_packed"),
            weight[expert_id, :intermediate_size, :],
        )
        yield (
            base.replace("gate_up_proj_packed", "up_proj.weight_packed"),
            weight[expert_id, intermediate_size:, :],
        )
    continue
if "moe.gate_up_proj_scale" in name and weight.dim() == 3:
    intermediate_size = weight.size(1) // 2
    for expert_id in range(weight.size(0)):
        base = name.replace("moe.", f"moe.experts.{expert_id}.")
        yield (
            base.replace("gate_up_proj_scale", "gate_proj.weight_scale"),
            weight[expert_id, :intermediate_size, :],
        )
        yield (
            base.replace("gate_up_proj_scale", "up_proj.weight_scale"),
            weight[expert_id, intermediate_size:, :],
        )
    continue
if "moe.down_proj_packed" in name and weight.dim() == 3:
    for expert_id in range(weight.size(0)):
        base = name.replace("moe.", f"moe.experts.{expert_id}.")
        yield base.replace("down_proj_packed", "down_proj.weight_packed"), weight[expert_id]
    continue
if "moe.down_proj_scale" in name and weight.dim() == 3:
    for expert_id in range(weight.size(0)):
        base = name.replace("moe.", f"moe.experts.{expert_id}.")
        yield base.replace("down_proj_scale", "down_proj.weight_scale"), weight[expert_id]
    continue
