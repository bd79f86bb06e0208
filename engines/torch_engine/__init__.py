"""The embedded torch engine: HF model + KV cache + per-request seeded sampling (CPU or GPU)."""
