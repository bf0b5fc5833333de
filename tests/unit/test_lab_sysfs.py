"""The lab's fake mlx5 sysfs tree (lab/sysfs.py) must read back through the agent's own reader
(agent/rdma_sysfs.py): a layout drift there would leave every lab agent without RDMA data."""
from __future__ import annotations

from pathlib import Path

from c4.agent import rdma_sysfs
from c4.lab.control import shipped_topologies
from c4.lab.fabric import Fabric
from c4.lab.sysfs import COUNTERS, HW_COUNTERS, make_tree, nic_pci, write_atomic
from c4.core.topology import Topology


def test_the_agent_reads_the_lab_tree(tmp_path: Path) -> None:
    fab = Fabric(Topology.load(shipped_topologies()["rails2"]), "t")
    nics = fab.host_nics(next(iter(fab.topology.hosts)))
    assert len(nics) == 2
    make_tree(tmp_path, nics, {nics[0].dev: 0.1})
    ports = rdma_sysfs.all_ports(tmp_path)
    assert sorted(p.dev for p in ports) == sorted(n.dev for n in nics)
    for i, nic in enumerate(nics):
        dev = rdma_sysfs.read_device(tmp_path / "class" / "infiniband" / nic.dev)
        assert dev.pci == nic_pci(nic, i)
        ref = next(p for p in ports if p.dev == nic.dev)
        st = rdma_sysfs.read_port_status(ref)
        assert st.netdev == nic.netdev
        assert st.link_layer == "Ethernet"
        assert st.state == rdma_sysfs.parse_state("4: ACTIVE")
        values, bad = rdma_sysfs.read_counters(ref.path)
        assert bad == []
        assert set(values) == set(COUNTERS) | set(HW_COUNTERS)
        assert set(values.values()) == {0}
    ref = next(p for p in ports if p.dev == nics[0].dev)
    assert rdma_sysfs.read_port_status(ref).rate_gbps == 0.1
    write_atomic(ref.path / "counters" / "port_xmit_data", "1234")
    assert rdma_sysfs.read_counters(ref.path)[0]["port_xmit_data"] == 1234
