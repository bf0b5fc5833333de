#!/usr/bin/env bash
# Run every benchmark in bench/ (the `make bench` target). Prints numbers; asserts nothing.
#
#   bash bench/run.sh            # quick mode: each benchmark's short flags, a few minutes
#   bash bench/run.sh --full     # each benchmark at its documented default size
#   bash bench/run.sh --strict   # exit 1 at the end if any benchmark failed
#   bash bench/run.sh ingest diagnosis   # only these (the names in BENCHES below)
#
# Every benchmark runs even when an earlier one fails; a summary lists each one's outcome.
# The exit status is 0 unless --strict is given and one failed: benchmarks measure, they do
# not gate (a host without gcc or root still gets the numbers it can produce). Root-only
# benchmarks are skipped with a message when not root. Each has a time limit
# (C4_BENCH_TIMEOUT seconds; default 600, 3600 with --full). See bench/README.md and
# docs/benchmarks.md.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

full=0 strict=0 only=()
for arg in "$@"; do
    case $arg in
        --full) full=1 ;;
        --strict) strict=1 ;;
        -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "bench/run.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
        *) only+=("$arg") ;;
    esac
done

LIMIT=${C4_BENCH_TIMEOUT:-$((full ? 3600 : 600))}

# name | file | needs root | quick arguments | what it measures
BENCHES=(
    "ingest|bench/ingest.py|no|--quick|aggregator ingest: frames/s per stage vs msgpack"
    "diagnosis|bench/diagnosis|no|--quick|C4D precision, recall, time to localise (c4 sim)"
    "planner|bench/planner|no|--quick|C4P max link load vs LP bound / MILP optimum / ECMP, plan time"
    "load|bench/load|no|--quick|aggregator: N CURVE agents at 1 Hz, a 50x flood: ack latency, CPU, RSS"
    "plugin_overhead|bench/plugin_overhead|no|--iters 200000|NCCL profiler plugin ns per call"
    "agent_cpu|bench/agent_cpu.py|yes|--connections 1000 --seconds 5|tcp_flows collector CPU, RSS"
    "tcp_flows_overhead|bench/tcp_flows_overhead.py|yes|--round-trips 5000 --runs 3|eBPF ns/event"
    "verbs_qp_overhead|bench/verbs_qp_overhead.py|yes|--calls 20000 --qps 500|uprobe ns/modify_qp"
    "pathctl_tcp_check|bench/pathctl_tcp_check.py|no|--connections 1000|agent cost of a TCP plan in flight"
    "lab|bench/lab|yes|--quick|netns lab: build/teardown, step time, bus bw, time to name each fault"
)

declare -A known=()
for name in "${only[@]}"; do
    if [[ " ${BENCHES[*]} " != *" $name|"* ]]; then
        echo "bench/run.sh: no benchmark named $name" >&2; exit 2
    fi
done
results=()
failed=0
for entry in "${BENCHES[@]}"; do
    IFS='|' read -r name file root quick what <<<"$entry"
    known[$file]=1
    if ((${#only[@]})) && [[ ! " ${only[*]} " == *" $name "* ]]; then
        continue
    fi
    printf '\n==================== %s: %s\n' "$name" "$what"
    if [[ ! -e $file ]]; then
        echo "not present: $file"; results+=("$name|absent|0"); continue
    fi
    if [[ $root == yes && $(id -u) != 0 ]]; then
        echo "skipped: needs root (eBPF); run: sudo bash bench/run.sh $name"
        results+=("$name|skipped (not root)|0"); continue
    fi
    args=()
    ((full)) || read -r -a args <<<"$quick"
    cmd=("$file" "${args[@]}")
    [[ $file == *.py ]] && cmd=("$PY" "${cmd[@]}")
    echo "\$ ${cmd[*]}"
    start=$SECONDS
    # SIGINT on timeout: Python benchmarks unwind (finally) and remove their namespaces;
    # --foreground keeps Ctrl-C reaching the benchmark in a terminal. The venv's python
    # first on PATH: bench/diagnosis is a `#!/usr/bin/env python3` script.
    PATH="$(dirname "$PY"):$PATH" timeout --foreground -s INT --kill-after=30 "$LIMIT" \
        "${cmd[@]}"
    rc=$?
    took=$((SECONDS - start))
    if ((rc == 0)); then
        results+=("$name|ok|$took")
    else
        ((rc == 124)) && why="timed out after ${LIMIT}s" || why="exit status $rc"
        echo "FAILED: $name ($why)"
        results+=("$name|FAILED ($why)|$took"); failed=$((failed + 1))
    fi
done

# A benchmark someone added without listing it here is reported, not silently ignored.
for f in bench/*; do
    [[ -f $f && ( -x $f || $f == *.py ) ]] || continue
    [[ $f == bench/run.sh || -n ${known[$f]:-} ]] && continue
    echo "note: $f is not listed in bench/run.sh; add it with its quick flags"
done

printf '\n==================== summary (%s mode)\n' "$( ((full)) && echo full || echo quick)"
for r in "${results[@]}"; do
    IFS='|' read -r name outcome took <<<"$r"
    printf '  %-20s %-32s %5ss\n' "$name" "$outcome" "$took"
done
if ((failed)); then
    echo "$failed benchmark(s) failed$( ((strict)) || echo '; exit status 0 without --strict')"
    ((strict)) && exit 1
fi
exit 0
