"""Run by torchrun in test_t2i_ddp: a two-rank gloo t2i training run (self-distillation from captions)."""

import sys

import torch

from lisa_trt.testing import make_target
from lisa_trt.train import DataConfig, LossConfig, TrainConfig, train_drafter

torch.set_num_threads(1)
out, captions = sys.argv[1], sys.argv[2]
target = make_target("t2i", std=0.3)
cfg = TrainConfig(steps=2, batch_size=4, ttt_steps=2, warmup_steps=1, checkpoint_every=1, log_every=1, lr=3e-3,
                  loss=LossConfig(kind="eagle3"),
                  data=DataConfig(num_samples=8, eval_samples=2, gen_batch=8, cfg_scale=3.0, caption_file=captions))
res = train_drafter(target, None, cfg, out, progress=False)
print("RANK", torch.distributed.is_initialized(), res["steps"], flush=True)
