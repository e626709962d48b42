"""The vLLM adapter: its plugin, the functions it wraps, and the step hooks of each model runner (V1, V2)."""
