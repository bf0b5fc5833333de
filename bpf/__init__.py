"""eBPF programs (C, compiled by BCC at agent start), shipped as package data of c4.bpf."""
