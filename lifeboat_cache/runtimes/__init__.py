"""Runtime shims: `mlx` (MLX chunk copier, background writer) and `mlx_hybrid` (recurrent-state snapshots).

Nothing is imported here, so importing one runtime never pulls in the other's dependencies.
"""
