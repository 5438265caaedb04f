"""Run by torchrun in test_ddp: a two-rank gloo training run on the tiny target."""

import sys

import torch

from lisa_trt.testing import make_target
from lisa_trt.train import DataConfig, LossConfig, TrainConfig, train_drafter

torch.set_num_threads(1)
out = sys.argv[1]
target = make_target(seed=0)
codebook = torch.nn.functional.normalize(torch.randn(256, 8, generator=torch.Generator().manual_seed(7)), dim=-1)
cfg = TrainConfig(steps=2, batch_size=4, ttt_steps=2, warmup_steps=1, checkpoint_every=1, log_every=1, lr=3e-3,
                  loss=LossConfig(kind="eagle3"),
                  data=DataConfig(num_samples=8, eval_samples=2, gen_batch=8, cfg_scale=2.0))
res = train_drafter(target, codebook, cfg, out, progress=False)
print("RANK", torch.distributed.is_initialized(), res["steps"], flush=True)
