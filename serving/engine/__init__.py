"""The generation engine: in-flight batching of decoder steps over a shared KV cache."""
