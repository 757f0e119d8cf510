"""SGLang integrations: the HiCache storage backend, the plugin entry point and the MLX radix cache.

Nothing is imported here: SGLang imports `sglang_plugin` in every process it starts, and that must not
pull in torch, MLX or the backend unless the launch needs them.
"""
