"""`c4 lab gloo`: a real job nobody here wrote. PyTorch DistributedDataParallel trains a small
MLP with the gloo backend across the lab's hosts, one rank per host, no plugin: c4 sees it
only through the agents' eBPF `tcp_flows` (on unless `lab up --no-ebpf`). Needs the `lab` extra (torch).

Each rank is `python -m c4.lab.gloo RUN_DIR RANK` in its host's namespace and cgroup, with
C4_JOB_ID set (how the agent attaches its flows to the job). Rank 0 logs steps.jsonl like
the ring job (step time; bus bandwidth of the gradient AllReduce estimated from the step).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

GLOO_PORT = 29500


def rank_main(run_dir: Path, rank: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    cfg = json.loads((run_dir / "config.json").read_text())
    me = cfg["ranks"][rank]
    os.environ["GLOO_SOCKET_IFNAME"] = me["netdev"]
    torch.set_num_threads(1)  # two shared cores: the fabric is the bottleneck, not the CPU
    dist.init_process_group("gloo", init_method=f"tcp://{cfg['ranks'][0]['addr']}:{GLOO_PORT}",
                            rank=rank, world_size=len(cfg["ranks"]))
    torch.manual_seed(0)
    width = cfg["width"]
    model = DDP(nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width),
                              nn.ReLU(), nn.Linear(width, 10)))
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    log = open(run_dir / "steps.jsonl", "a") if rank == 0 else None
    n = len(cfg["ranks"])
    step = 0
    while cfg["steps"] == 0 or step < cfg["steps"]:
        t0 = time.monotonic()
        x = torch.randn(cfg["batch"], width)
        y = torch.randint(0, 10, (cfg["batch"],))
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()  # DDP all-reduces the gradients over gloo here
        opt.step()
        dt = time.monotonic() - t0
        if log is not None:
            busbw = params * 4 * 8 / dt * 2 * (n - 1) / n / 1e6
            log.write(json.dumps({"step": step, "t": time.time(), "step_s": round(dt, 4),
                                  "allreduce_s": round(dt, 4), "busbw_mbit": round(busbw, 2),
                                  "loss": round(float(loss), 4)}) + "\n")
            log.flush()
        step += 1
    if log is not None:
        log.write(json.dumps({"done": True, "steps": step, "t": time.time()}) + "\n")
        log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    rank_main(Path(sys.argv[1]), int(sys.argv[2]))
