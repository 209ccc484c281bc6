"""A stand-in training script for the launch tests: join the process group over gloo, all-reduce
once, and record what torchrun and the launcher handed this rank (JSON in $STANDIN_OUT)."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)  # 1 + 2 + ... + world_size when every rank took part
record = {
    "rank": rank, "world_size": world_size, "sum": total.item(), "argv": sys.argv[1:],
    "env": {name: os.environ.get(name) for name in ("LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE",
                                                    "CUDA_DEVICE_MAX_CONNECTIONS", "SLURM_NODEID")},
}
Path(os.environ["STANDIN_OUT"], f"rank-{rank}.json").write_text(json.dumps(record))
dist.barrier()
dist.destroy_process_group()
