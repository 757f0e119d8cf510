"""`VARIABLES`: every LIFEBOAT_* environment variable the package reads, assembled from each layer's own list.

Each layer declares the variables it reads next to their parsers: the core in `config/env.py`
(`CORE_VARIABLES`), the MLX runtime in `runtimes/mlx/env.py` (`MLX_VARIABLES`), the SGLang launch in
`integrations/launch/env.py` (`SGLANG_VARIABLES`). Only a module above all of them may gather the whole
table without a lower layer importing upward, so this one sits in the apps layer, like the CLI.
docs/operating.md's environment table is checked against it (tests/unit/config/test_env.py).

Apps layer: imports the three homes above.
"""

from __future__ import annotations

from ..config import CORE_VARIABLES, Variable
from ..integrations.launch import SGLANG_VARIABLES
from ..runtimes.mlx import MLX_VARIABLES

#: Every LIFEBOAT_* variable the package reads (tests check the source and docs/operating.md against it).
VARIABLES: tuple[Variable, ...] = CORE_VARIABLES + SGLANG_VARIABLES + MLX_VARIABLES

BY_NAME: dict[str, Variable] = {v.name: v for v in VARIABLES}
