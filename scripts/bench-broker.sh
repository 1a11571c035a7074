# Sourced by the benchmark scripts: a tansu broker with memory storage on a
# free loopback port, its log in $work/tansu.log.
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
