#!/usr/bin/env bash
# Coverage-guided fuzzing of the strict event decoder (fuzz/, target
# `decode`): any bytes must decode to a contract-valid event that survives
# Arrow and a JSON re-encoding, or be refused with a reason; never a panic
# or a hang.
#
# Usage: scripts/fuzz.sh [SECONDS]      (default 60)
#
# The seeds under fuzz/seeds/ (committed) are copied into the working
# corpus fuzz/corpus/decode (gitignored), which grows across runs. A crash
# lands in fuzz/artifacts/decode/; copy it under
# schema/tests/fuzz-regressions/ so schema/tests/fuzz_regressions.rs replays
# it as a plain test, then fix the decoder.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=never

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "== installing cargo-fuzz =="
  cargo install cargo-fuzz --locked
fi

# cargo fuzz builds with nightly-only flags (-Zsanitizer=address, the
# sancov coverage passes and other -Z options). This machine only has
# the stable toolchain, so RUSTC_BOOTSTRAP=1 lets stable rustc accept those
# -Z flags. It is set for this script only: regular builds and CI stay on
# plain stable.
export RUSTC_BOOTSTRAP=1

corpus=fuzz/corpus/decode
mkdir -p "$corpus" fuzz/artifacts/decode
cp -f fuzz/seeds/* "$corpus"/

# The workspace's shared target dir; the fuzz build goes under its own
# target triple there, so it does not disturb the regular builds.
target_dir=${CARGO_TARGET_DIR:-$PWD/target}

echo "== cargo fuzz run decode for ${seconds}s (corpus: $(ls "$corpus" | wc -l) inputs) =="
start=$(date +%s)
set +e
cargo fuzz run --fuzz-dir fuzz --target-dir "$target_dir" decode "$corpus" -- \
  -max_total_time="$seconds" -timeout=10 -print_final_stats=1
status=$?
set -e
end=$(date +%s)
echo "== fuzz exit status $status after $((end - start))s wall (build included);" \
  "corpus now $(ls "$corpus" | wc -l) inputs; artifacts: $(ls fuzz/artifacts/decode | wc -l) =="
exit $status
