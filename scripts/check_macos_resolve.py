"""Check that pip's resolver accepts requirements/mlx-macos.txt for macOS arm64 wheels, from any host.

    python scripts/check_macos_resolve.py [-r requirements/mlx-macos.txt] [extra pip args...]

`pip install --dry-run --platform macosx_14_0_arm64 --only-binary=:all:` picks macOS wheels, but pip still
evaluates environment markers for the host (on Linux, torch's `platform_system == "Linux"` CUDA
dependencies are demanded). This script runs the same pip command with the markers of an Apple-silicon
Mac (CPython 3.11), so the resolution is the one a Mac would do. It needs network access to PyPI.
"""

from __future__ import annotations

import sys
import tempfile

MAC_MARKERS = {
    "implementation_name": "cpython", "implementation_version": "3.11.9", "os_name": "posix",
    "platform_machine": "arm64", "platform_python_implementation": "CPython", "platform_release": "23.0.0",
    "platform_system": "Darwin", "platform_version": "Darwin Kernel Version 23.0.0", "python_full_version": "3.11.9",
    "python_version": "3.11", "sys_platform": "darwin",
}


def main(argv: list[str]) -> int:
    from pip._internal.cli.main import main as pip_main
    from pip._vendor.packaging import markers

    base = markers.default_environment
    markers.default_environment = lambda: {**base(), **MAC_MARKERS}  # type: ignore[assignment]
    args = argv or ["-r", "requirements/mlx-macos.txt"]
    with tempfile.TemporaryDirectory() as target:
        return pip_main(["install", "--dry-run", "--ignore-installed", "--platform", "macosx_14_0_arm64",
                         "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                         "--target", target, *args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
