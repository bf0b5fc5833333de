#!/usr/bin/env bash
# `make demo` (after `make setup`): the lab end to end (lab/demo.py, docs/lab.md). A leaf-spine
# fabric of network namespaces with c4's aggregator and one agent per host; a ring AllReduce
# job reporting through the c4 NCCL plugin; packet loss on one fabric link and a frozen rank,
# each named by c4 with its evidence; teardown; C4P on a 2-host lab (colliding flows, c4 plan
# apply, step time before and after); a table of what was shown. Exits 1 if a step did not
# show what it should. Needs root; about 1.5-2.5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "[demo] the lab needs root (network namespaces, nftables, cgroups): sudo make demo" >&2
  exit 1
fi
[ -t 1 ] || export COLUMNS="${COLUMNS:-140}"  # tables for a log, not an 80-column guess
exec .venv/bin/python -m c4.lab.demo "$@"
