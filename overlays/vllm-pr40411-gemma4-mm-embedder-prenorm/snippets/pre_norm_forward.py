# vLLM PR #40411: RMSNorm (no scale) first, then the projection, as transformers
# does; the post-projection norm below is no longer reached.
embs_proj, _ = self.embedding_projection(self.embedding_pre_projection_norm(inputs_embeds))
return embs_proj
