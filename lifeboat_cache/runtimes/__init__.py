"""Runtime shims: `mlx/` (the MLX package: chunk keys, fingerprint, pool transfer, writer, reader, engine,
hybrid-model state).

Nothing is imported here, so importing one runtime never pulls in the other's dependencies.
"""
