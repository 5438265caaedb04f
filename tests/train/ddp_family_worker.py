"""Run by torchrun in test_train_families.test_ddp_two_ranks_match_single_process_janus: a two-rank gloo
training run of a Janus-Pro drafter (a prompt-id family) on a tiny random checkpoint.

    python -m torch.distributed.run --standalone --nproc_per_node 2 ddp_family_worker.py MODEL_DIR OUT
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))


def config():
    from lisa_trt.train import DataConfig, LossConfig, TrainConfig

    return TrainConfig(steps=2, batch_size=4, ttt_steps=2, warmup_steps=1, checkpoint_every=1, log_every=1, lr=3e-3,
                       loss=LossConfig(kind="eagle3"),
                       data=DataConfig(num_samples=8, eval_samples=2, gen_batch=8, cfg_scale=3.0, top_k=8))


def request(target):
    from test_janus import prompts

    from lisa_trt.train.requests import prompt_request

    return prompt_request(target, prompts(B=6, T=6, seed=11))


if __name__ == "__main__":
    import lisa_trt
    from lisa_trt.train import train_drafter

    torch.set_num_threads(1)
    target = lisa_trt.load_target(sys.argv[1])
    res = train_drafter(target, None, config(), sys.argv[2], progress=False, request=request(target))
    print("RANK", torch.distributed.is_initialized(), res["steps"], flush=True)
