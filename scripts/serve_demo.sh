#!/usr/bin/env bash
# The returning user through a real SGLang server on this machine's CPU: scripts/serve_demo.sh [args...]
# Launch, answer a long prompt, SIGTERM, launch again on the same store, answer again from LifeboatCache.
# Builds/refreshes .venv first (scripts/_venv.sh); uses the embedded default store unless configured.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
# shellcheck source=scripts/_venv.sh
source "$root/scripts/_venv.sh" || exit 1

exec python -m lifeboat_cache.demo.serve_restart "$@"
