#!/usr/bin/env bash
# Run the LifeboatCache test suite: scripts/test.sh [--cov] [pytest args...]
# Builds/refreshes .venv first (scripts/_venv.sh). Fails when pytest collects no tests (exit 5),
# so an empty or mis-pointed run can never pass as green.
# Runs every test but the long `stress` variants (scripts/stress.sh), `slow` included (`-m "not stress"`
# overrides pyproject's dev-loop default;
# a later `-m EXPR` among the arguments still wins).
# The 25 slowest tests are listed at the end: the suite must stay under ~45 minutes on CI's 2 cores.
# --cov: measure line coverage of lifeboat_cache, including the code that runs in child processes
# (coverage's `patch = ["subprocess"]`, see [tool.coverage.*] in pyproject.toml), and print the report.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 1
# shellcheck source=scripts/_venv.sh
source "$root/scripts/_venv.sh" || exit 1

cov=0
args=()
for a in "$@"; do
    if [[ "$a" == "--cov" ]]; then cov=1; else args+=("$a"); fi
done

if [[ $cov -eq 1 ]]; then
    rm -f .coverage .coverage.*
    python -m coverage run -m pytest -m "not stress" "${args[@]}"
    rc=$?
    python -m coverage combine -q || true
    python -m coverage report || true
else
    python -m pytest -m "not stress" --durations=25 "${args[@]}"
    rc=$?
fi
if [[ $rc -eq 5 ]]; then
    echo "scripts/test.sh: pytest collected no tests (exit 5): treating as failure" >&2
    exit 1
fi
exit "$rc"
