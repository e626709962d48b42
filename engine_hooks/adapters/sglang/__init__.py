"""The SGLang adapter: its plugin, the functions it wraps, its step hooks and per-mode decode graphs."""
