#!/usr/bin/env bash
# Mutation testing, by hand or on a schedule (never in every CI run): cosmic-ray mutates agent/policy.py,
# steps/payments.py and agent/tokens.py one change at a time and runs each module's fast tests (SQLite only)
# against every mutant. cosmic-ray edits the files it mutates, so it works on a scratch copy of the tree.
#   pip install -e '.[dev,mutation]'
#   bash tests/mutation/run.sh                 # all three (about 40 minutes on 2 cores)
#   bash tests/mutation/run.sh tokens policy   # some of them
# Sessions and reports land in test-artifacts/mutation/; docs/mutation-testing.md explains the survivors.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$root/test-artifacts/mutation"
mkdir -p "$out"
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(policy payments tokens)

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
tar -C "$root" --exclude=./.venv --exclude=./.git --exclude=./test-artifacts --exclude=__pycache__ -cf - . | tar -C "$scratch" -xf -
cd "$scratch"
export PYTHONDONTWRITEBYTECODE=1 REFUND_AGENT_TEST_POSTGRES_URL=off

for target in "${targets[@]}"; do
  session="$out/$target.sqlite"
  rm -f "$session"
  cosmic-ray init "tests/mutation/$target.toml" "$session"
  cosmic-ray baseline "tests/mutation/$target.toml"
  cosmic-ray exec "tests/mutation/$target.toml" "$session"
  cr-report "$session" --surviving-only --show-diff > "$out/$target-survivors.txt"
  echo "$target: $(cr-report "$session" | tail -n 3 | tr '\n' ' ')"
done
