#!/usr/bin/env bash
# Run the returning-user demo: scripts/demo.sh [demo args...]
# Builds/refreshes .venv first (scripts/_venv.sh); uses the embedded default store unless configured.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
# shellcheck source=scripts/_venv.sh
source "$root/scripts/_venv.sh" || exit 1

exec python -m lifeboat_cache.demo "$@"
