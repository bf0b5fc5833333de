#!/usr/bin/env bash
# `make demo`: an aggregator and one agent on loopback, the agent reading a fixture mlx5 sysfs
# tree (2 ports) whose counters this script bumps like traffic would; then `c4 hosts` and
# `c4 host`. Interim demo until the lab fabric (design.md) lands.
set -euo pipefail
cd "$(dirname "$0")/.."
C4=(.venv/bin/python -m c4.cli)
run=demo-run
rm -rf "$run"; mkdir -p "$run"
cp -r tests/fixtures/sysfs/mlx5_2port "$run/sys"
port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ZPORT=$(port); HPORT=$(port)
cat > "$run/aggregator.toml" <<EOT
listen = "tcp://127.0.0.1:$ZPORT"
api = "127.0.0.1:$HPORT"
db = "$PWD/$run/c4.db"
EOT
cat > "$run/agent.toml" <<EOT
aggregator = "tcp://127.0.0.1:$ZPORT"
interval = 1.0
host = "gpu-demo-01"
sysfs_root = "$PWD/$run/sys"
run_dir = "$PWD/$run/run"
[collectors]
enabled = ["host", "rdma"]
EOT
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
"${C4[@]}" aggregator run --config "$run/aggregator.toml" 2>"$run/aggregator.log" & pids+=($!)
"${C4[@]}" agent run --config "$run/agent.toml" --record "$run/agent.c4rec" 2>"$run/agent.log" & pids+=($!)
echo "[demo] aggregator on tcp://127.0.0.1:$ZPORT (API http://127.0.0.1:$HPORT), agent gpu-demo-01"
# Traffic on port 1: data, ECN marks and congestion notifications move between samples.
bump() {
  local i=0
  while true; do
    i=$((i + 1))
    for f in hw_counters/np_cnp_sent hw_counters/np_ecn_marked_roce_packets counters/port_xmit_data; do
      p=$(ls -d "$run"/sys/class/infiniband/*/ports/1/$f | head -n1)
      echo $(( $(cat "$p") + 1000 * (i % 7 + 1) )) > "$p"
    done
    sleep 0.3
  done
}
bump & pids+=($!)
sleep 4
export C4_AGGREGATOR="http://127.0.0.1:$HPORT"
[ -t 1 ] || export COLUMNS="${COLUMNS:-140}"  # tables for a log, not an 80-column guess
echo "[demo] \$ c4 hosts"
"${C4[@]}" hosts
echo "[demo] \$ c4 host gpu-demo-01"
"${C4[@]}" host gpu-demo-01
echo "[demo] recorded frames in $run/agent.c4rec: replay with '.venv/bin/c4 replay $run/agent.c4rec'"
