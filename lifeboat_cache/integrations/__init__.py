"""SGLang integrations: the HiCache storage backend, the plugin entry point and the MLX radix cache.

  sglang_backend.py  LifeboatHiCacheStorage, the L3 tier SGLang's `dynamic` backend loads by this path
  sglang_plugin.py   the `sglang.srt.plugins` entry point `register()`, loaded by this path
  hicache/           the backend's parts: host-pool pages as store pages, keys per pool and rank,
                     argument checks, the never-raise guard, trace lines
  launch/            how a launch is adjusted: env vars, launch rules, host-pool sizing, preflight, CPU hooks
  radix_cache/       `--radix-cache-backend lifeboat` for SGLang's MLX runtime

Nothing is imported here: SGLang imports `sglang_plugin` in every process it starts, and that must not
pull in torch, MLX or the backend unless the launch needs them.
"""
