"""Hardware faults reported directly: Xid, NIC link down or flapping, PFC pause storms,
uncorrected PCIe AER, silent hosts. Each is tied to the job using that device or host (an Xid
through the process id the driver blames)."""
from __future__ import annotations

from typing import Any

from c4.core.topology import endpoint

from .config import DiagnosisConfig
from .findings import Finding, Suspect
from .model import Model

DOWN_STATES = ("DOWN", "INIT", "ARMED", "POLLING", "DISABLED")


class Hardware:
    def __init__(self, cfg: DiagnosisConfig, model: Model) -> None:
        self.cfg = cfg
        self.model = model
        self.down: dict[str, tuple[str, float, str]] = {}  # NIC endpoint -> (host, since, why)
        # NIC endpoint -> when it last lost its carrier (down, or a flap): what it sent and
        # received then timed out because of it (outage.py sets that aside)
        self.carrier_lost: dict[str, float] = {}
        self.ports: dict[tuple[str, str, int], str] = {}
        self.silent: dict[str, float] = {}  # host -> last seen
        self.pending: list[Finding] = []
        self.ignored: dict[str, int] = {}  # event reason -> count (Xid codes ignored, ...)

    # -- inputs -------------------------------------------------------------------------------
    def on_event(self, host: str, body: dict[str, Any], now: float) -> None:
        t, a = body["type"], body["attrs"]
        if t == "xid":
            self._xid(host, a, now)
        elif t == "nic_link":
            ep = self._nic(host, pci=a.get("pci"), netdev=a.get("netdev"))
            self._link(host, ep, a["state"] == "down", f"kernel: {a.get('netdev')} link "
                       f"{a['state']}", now)
        elif t == "port_state":
            ep = endpoint(host, a["dev"])
            self.ports[(host, a["dev"], a["port"])] = a["to"]
            if a["to"].upper() in DOWN_STATES or a["to"].upper() == "ACTIVE":
                self._link(host, ep, a["to"].upper() != "ACTIVE",
                           f"port {a['port']} {a['from']} -> {a['to']}", now)
        elif t == "link_flap":
            ep = endpoint(host, a["dev"])
            self.carrier_lost[ep] = now
            self._direct("hw_link_flap", host, Suspect("nic", ep, host, None, 0.9),
                         f"{ep} port {a['port']} went down {a['count']} time(s) in one interval",
                         {"flaps": a["count"], "port": a["port"]}, now)
        elif t == "pause_storm":
            ep = endpoint(host, a["dev"]) if a.get("dev") else self._nic(host, netdev=a["netdev"])
            self._direct("hw_pfc_storm", host, Suspect("nic", ep, host, None, 0.9),
                         f"PFC pause storm on {a['netdev']} ({a['counter']} +{a['delta']})",
                         {"counter": a["counter"], "delta": a["delta"], "netdev": a["netdev"]},
                         now)
        elif t == "pcie_aer":
            if a["severity"] == "corrected":
                self.ignored["aer_corrected"] = self.ignored.get("aer_corrected", 0) + 1
                return
            sus = self._pci_suspect(host, a["pci"])
            self._direct("hw_aer", host, sus,
                         f"uncorrected ({a['severity']}) PCIe AER from {a['pci']} on {host}",
                         {"pci": a["pci"], "severity": a["severity"], "port": a.get("port"),
                          "text": a.get("text", "")[:200]}, now)

    def on_rdma(self, host: str, section: dict[str, Any], now: float) -> None:
        for p in section.get("ports", []):
            key = (host, p["dev"], p["port"])
            state = str(p["state"]).upper()
            prev = self.ports.get(key)
            self.ports[key] = state
            ep = endpoint(host, p["dev"])
            if prev == "ACTIVE" and state != "ACTIVE":
                self._link(host, ep, True, f"port {p['port']} state {state}", now)
            elif state == "ACTIVE" and ep in self.down:
                self._link(host, ep, False, "port ACTIVE", now)

    def host_silent(self, host: str, last_seen: float) -> None:
        self.silent[host] = last_seen

    def host_back(self, host: str) -> None:
        self.silent.pop(host, None)

    def forget_hosts(self, hosts: set[str]) -> None:
        for h in hosts:
            self.silent.pop(h, None)
        for key in [k for k in self.ports if k[0] in hosts]:
            del self.ports[key]
        for ep in [ep for ep, v in self.down.items() if v[0] in hosts]:
            del self.down[ep]
        for ep in [ep for ep in self.carrier_lost if ep.partition("/")[0] in hosts]:
            del self.carrier_lost[ep]

    # -- output -------------------------------------------------------------------------------
    def tick(self, now: float) -> list[Finding]:
        out, self.pending = self.pending, []
        for ep, (host, since, why) in self.down.items():
            self.carrier_lost[ep] = now  # still down: still losing what it carried
            out.append(self._finding("hw_nic_down", host, Suspect("nic", ep, host, None, 0.95),
                                     f"NIC {ep} is down ({why})",
                                     {"down_s": round(now - since, 1), "why": why}, since))
        for host, last in self.silent.items():
            out.append(self._finding(
                "host_silent", host, Suspect("host", host, host, None, self.cfg.silent_confidence),
                f"{host} sent nothing for {now - last:.0f}s",
                {"silent_s": round(now - last, 1)}, last))
        return out

    # -- helpers ------------------------------------------------------------------------------
    def _xid(self, host: str, a: dict[str, Any], now: float) -> None:
        if a["code"] in self.cfg.xid_ignore:
            key = f"xid_{a['code']}"
            self.ignored[key] = self.ignored.get(key, 0) + 1
            return
        ref = self.model.rank_of_pid(host, a.get("pid"))
        rank = ref[1].rank if ref else None
        pci = a["pci"].rsplit(".", 1)[0] if a["pci"].count(".") else a["pci"]
        who = f" (rank {rank} of {ref[0].job})" if ref else ""
        f = self._finding("hw_xid", host, Suspect("gpu", f"{host}/{pci}", host, rank, 0.95),
                          f"Xid {a['code']} on {host} GPU {pci}{who}: {a.get('text', '')[:120]}",
                          {"code": a["code"], "pci": pci, "pid": a.get("pid"),
                           "process": a.get("process")}, now, hold=self.cfg.event_hold_s)
        if ref:
            f.job, f.comm = ref[0].job, ref[0].comm
            ref[1].gpu_fault = now  # its rank idles because of this, not for a checkpoint
        self.pending.append(f)

    def _link(self, host: str, ep: str, down: bool, why: str, now: float) -> None:
        if down:
            self.down.setdefault(ep, (host, now, why))
            self.carrier_lost[ep] = now
        elif self.down.pop(ep, None) is not None:
            self.carrier_lost[ep] = now  # down until now

    def _direct(self, cls: str, host: str, sus: Suspect, summary: str, ev: dict[str, Any],
                now: float) -> None:
        self.pending.append(self._finding(cls, host, sus, summary, ev, now,
                                          hold=self.cfg.event_hold_s))

    def _finding(self, cls: str, host: str, sus: Suspect, summary: str, ev: dict[str, Any],
                 first: float, hold: float | None = None) -> Finding:
        """Jobs sharing a host use different GPUs and NICs: a NIC's fault is the job's whose
        ranks use that NIC; a host's, the host's first job (all are listed)."""
        jobs = self.model.jobs_on_host(host)
        ev = dict(ev, jobs_on_host=jobs[:8])
        users = self.model.jobs_using_nic(sus.id) if sus.kind == "nic" else []
        job = users[0] if users else jobs[0] if jobs else None
        return Finding(cls, job, None, [sus], summary, ev, first, hold_s=hold, direct=True)

    def _nic(self, host: str, pci: str | None = None, netdev: str | None = None) -> str:
        info = self.model.host(host)
        dev = info.pci_dev.get(pci or "") or info.netdev_dev.get(netdev or "")
        return endpoint(host, dev or netdev or pci or "nic")

    def _pci_suspect(self, host: str, pci: str) -> Suspect:
        info = self.model.host(host)
        if pci in info.pci_dev:
            return Suspect("nic", endpoint(host, info.pci_dev[pci]), host, None, 0.9)
        short = pci.rsplit(".", 1)[0]
        if short in {g.rsplit(".", 1)[0] for g in info.gpu_pci}:
            return Suspect("gpu", f"{host}/{short}", host, None, 0.9)
        return Suspect("host", host, host, None, 0.8)
