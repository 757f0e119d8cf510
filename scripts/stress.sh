#!/usr/bin/env bash
# Stress variants of the failure-story tests (seeded, long): scripts/stress.sh [pytest args...]
# Same venv as scripts/test.sh; runs only tests marked `stress` (left out of the default run).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
# shellcheck source=scripts/_venv.sh
source "$root/scripts/_venv.sh" || exit 1

python -m pytest -m stress "$@"
rc=$?
if [[ $rc -eq 5 ]]; then
    echo "scripts/stress.sh: pytest collected no stress tests (exit 5): treating as failure" >&2
    exit 1
fi
exit "$rc"
