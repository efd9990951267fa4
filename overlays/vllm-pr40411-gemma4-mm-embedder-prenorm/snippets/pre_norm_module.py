# vLLM PR #40411: transformers' Gemma4MultimodalEmbedder normalises the tower's
# soft tokens (RMSNorm without scale, over the tower's width) before the
# projection; 0.19.x normalised after it. No weight: the checkpoint is unchanged.
self.embedding_pre_projection_norm = RMSNorm(
    embedding_dim,
    eps=self.eps,
    has_weight=False,
)
