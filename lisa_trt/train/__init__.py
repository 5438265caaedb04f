"""Drafter distillation for every model family: LISA and baseline losses, data, trainer (`train_drafter`)."""

from .data import DataConfig, TokenDataset, load_token_file, self_distill_tokens
from .losses import LossConfig
from .requests import prompt_request
from .trainer import TrainConfig, TrainVocab, evaluate_mal_proxy, train_drafter, ttt_unroll

__all__ = ["DataConfig", "LossConfig", "TokenDataset", "TrainConfig", "TrainVocab", "evaluate_mal_proxy",
           "load_token_file", "prompt_request", "self_distill_tokens", "train_drafter", "ttt_unroll"]
