# Shared by the benchmarks over simulated histories of several sizes
# (sourced): reads `[EVENTS...] [-- debug|release]` from the arguments into
# `sizes` (default 1000000 3000000), builds leaseline in that profile, and
# sets `bin` and a scratch directory `work`, removed on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
sizes=()
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --) profile=${2:-release}; break ;;
    *) sizes+=("$1") ;;
  esac
  shift
done
[ ${#sizes[@]} -gt 0 ] || sizes=(1000000 3000000)
export PATH="$HOME/.cargo/bin:$PATH"
if [ "$profile" = release ]; then
  cargo build --release -p leaseline --bin leaseline
else
  # The test build's profile and features: nothing to rebuild after scripts/test.sh.
  cargo test --workspace --no-run >/dev/null 2>&1
fi
bin=target/$profile/leaseline
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
