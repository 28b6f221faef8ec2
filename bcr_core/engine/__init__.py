"""The engine: one Hugging Face model and what the lab does with it (prefill, repair, draft,
decode), the KV tensor, attention kernels, RoPE, model and asset resolution, memory."""
