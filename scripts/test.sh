#!/usr/bin/env bash
# Run the LifeboatCache test suite: scripts/test.sh [pytest args...]
# Builds/refreshes .venv first (scripts/_venv.sh). Fails when pytest collects no tests (exit 5),
# so an empty or mis-pointed run can never pass as green.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
# shellcheck source=scripts/_venv.sh
source "$root/scripts/_venv.sh" || exit 1

python -m pytest "$@"
rc=$?
if [[ $rc -eq 5 ]]; then
    echo "scripts/test.sh: pytest collected no tests (exit 5): treating as failure" >&2
    exit 1
fi
exit "$rc"
