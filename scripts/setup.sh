#!/usr/bin/env bash
# One-shot, idempotent setup of a fresh Debian machine (run as root): distribution packages,
# kernel headers where BCC looks for them, tracefs, the venv, the project, the C plugin.
# A second run checks and skips; it takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[setup] %s\n' "$*"; }

APT_PACKAGES=(
  python3 python3-venv python3-dev         # the venv's interpreter is Debian's, to see BCC/pyverbs
  python3-bpfcc bpfcc-tools linux-headers-amd64   # eBPF collectors (BCC compiles against headers)
  python3-pyverbs rdma-core libibverbs-dev ibverbs-providers   # verbs ABI: uprobe target, QP listing
  iproute2 nftables iptables ethtool iperf3 kmod   # namespaces, loss injection, PFC stats, traffic
  gcc make pkg-config procps psmisc               # plugin and test libraries
  prometheus prometheus-alertmanager chromium     # promtool checks, alert and dashboard tests, /ui test
)

if [ "$(id -u)" -ne 0 ]; then
  say "not root: skipping apt, header links and tracefs (root-only tests will be skipped)"
else
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi

  # BCC looks for headers at /lib/modules/$(uname -r)/{build,source}. A host whose running
  # kernel has no header package gets the newest installed one; eBPF here reads tracepoint
  # arguments (layout from tracefs) and BTF, never struct offsets from these headers.
  kdir="/lib/modules/$(uname -r)"
  if [ ! -e "$kdir/build/include/linux/kconfig.h" ] && [ ! -e "$kdir/source/include/linux/kconfig.h" ]; then
    hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$hdr" ]; then
      common="${hdr%-amd64}-common"
      mkdir -p "$kdir"
      ln -sfn "$hdr" "$kdir/build"
      ln -sfn "$common" "$kdir/source"
      say "linked kernel headers $hdr (+ $common) at $kdir"
    else
      say "WARNING: no kernel headers found under /usr/src; eBPF collectors will be disabled"
    fi
  fi
  if [ ! -e /sys/kernel/tracing/events ]; then
    mount -t tracefs tracefs /sys/kernel/tracing && say "mounted tracefs"
  fi
  mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true
fi

# The venv is made from Debian's interpreter with system site packages: that is where BCC
# (python3-bpfcc) and pyverbs live. PyPI's "bcc" is an unrelated project.
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(sys.base_prefix != "/usr")' 2>/dev/null; then
  rm -rf .venv
  say "creating .venv from /usr/bin/python3"
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
stamp=.venv/.c4-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  say "installing the project and its test extras into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e '.[test,lab]'  # lab: torch for the lab's gloo job
  touch "$stamp"
fi

if [ -f plugin/Makefile ]; then
  make -s -C plugin
fi
say "ready"
