# Sourced by the benchmark scripts: a tansu broker with memory storage on a
# free loopback port, its log in $work/tansu.log.
#   bench_prepare MODULE...
#                  installs tansu and the Python modules missing (each
#                  `import_name` or `import_name=pip_name`), builds leaseline
#                  and bench_load (release); sets $target, $bin, $work and
#                  $profile_env (see LEASELINE_HEAP_PROFILE below).
#   start_broker   sets $port and $tansu_pid, returns once it accepts
#                  connections; the caller's EXIT trap kills $tansu_pid.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

start_broker() {
  port=$(free_port)
  RUST_LOG=warn tansu broker --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
    --storage-engine memory://tansu/ >"$work/tansu.log" 2>&1 &
  tansu_pid=$!
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && return 0; sleep 0.1; done
  echo "tansu did not start: $(cat "$work/tansu.log")" >&2
  return 1
}

bench_prepare() {
  export PATH="$HOME/.cargo/bin:$PATH"
  # Debian 12 and later refuse `pip install` outside a virtualenv (PEP 668).
  export PIP_BREAK_SYSTEM_PACKAGES=1
  command -v tansu >/dev/null || cargo install tansu --locked --features dynostore
  local m
  for m in "$@"; do
    python3 -c "import ${m%%=*}" 2>/dev/null ||
      python3 -m pip install --quiet --disable-pip-version-check "${m#*=}"
  done
  # LEASELINE_HEAP_PROFILE=DIR: a build with jemalloc's heap profiler, and
  # in $profile_env what turns it on for the one process the caller starts
  # with it (a sample every 1 MiB allocated on average, a profile of what
  # is live written to DIR every 8 GiB allocated and at exit).
  local features=()
  profile_env=()
  if [ -n "${LEASELINE_HEAP_PROFILE:-}" ]; then
    features=(--features heap-profile)
    mkdir -p "$LEASELINE_HEAP_PROFILE"
    profile_env=("_RJEM_MALLOC_CONF=prof:true,lg_prof_sample:20,lg_prof_interval:33,prof_final:true,prof_prefix:$(realpath "$LEASELINE_HEAP_PROFILE")/jeprof")
  fi
  cargo build --release -p leaseline --bin leaseline --example bench_load "${features[@]}"
  target=${CARGO_TARGET_DIR:-target}
  bin=$target/release/leaseline
  work=$(mktemp -d)
}
