#!/usr/bin/env python3
"""A Hugging Face folder of a random-weight Qwen3 model with the real Qwen3 tokenizer.

usage:  make_random_qwen3_folder.py OUT [--layers 28] [--tokenizer ../shared/data/qwen3-tokenizer]

The Qwen3-0.6B shape (hidden 1024, 16/8 heads, head_dim 128, intermediate 3072, vocab
151936, tied embeddings) with N(0, 0.02) weights, saved by transformers' save_pretrained
in bfloat16, plus tokenizer.json and tokenizer_config.json: a stand-in for a downloaded
Qwen3-0.6B where there is no internet, to run inputs/qwen3-0.6b-countdown.deck end to end
(the pretrained-folder path: safetensors import, tokenizer, chat template, stop tokens).
Needs torch and transformers.
"""
import argparse
import pathlib
import shutil

import torch
from transformers import AutoModelForCausalLM, Qwen3Config


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--tokenizer", default="../shared/data/qwen3-tokenizer")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=args.layers,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643,
                         eos_token_id=151645)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    out = pathlib.Path(args.out)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pathlib.Path(args.tokenizer) / name, out / name)
    print(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {args.layers} layers")


if __name__ == "__main__":
    main()
