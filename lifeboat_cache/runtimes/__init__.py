"""Runtime shims: `cuda` (pure launch-tuning rules for SGLang on CUDA) and `mlx` (MLX chunk copier).

Nothing is imported here, so importing one runtime never pulls in the other's dependencies.
"""
