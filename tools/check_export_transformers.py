#!/usr/bin/env python3
"""Check that transformers loads a `tandem export` folder unchanged and agrees with tandem.

usage:  check_export_transformers.py EXPORT_DIR LOGITS.safetensors [--prompt TEXT] [--atol 1e-4]

LOGITS.safetensors comes from tandem on the same folder:
    tandem generate --model EXPORT_DIR --prompt TEXT --max-new 1 --logits LOGITS.safetensors
and holds the prompt's ids (input_ids) and tandem's FP32 logits at every position (logits).
This script loads EXPORT_DIR with AutoModelForCausalLM and AutoTokenizer as they are,
runs the same ids in FP32 on the CPU, and compares: the largest absolute logit difference
must be within --atol, the model tests' FP32 tolerance (tests/test_model_hf_fixtures.cpp).
With --prompt, the tokenizer must also give tandem's ids. Exits 1 on a mismatch.
Needs torch, transformers and safetensors.
"""
import argparse
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("export_dir")
    parser.add_argument("logits")
    parser.add_argument("--prompt")
    parser.add_argument("--atol", type=float, default=1e-4)
    args = parser.parse_args()

    stored = load_file(args.logits)
    ids = stored["input_ids"].to(torch.long)
    tandem_logits = stored["logits"].to(torch.float32)
    ok = True
    if args.prompt is not None:
        tokenizer = AutoTokenizer.from_pretrained(args.export_dir)
        hf_ids = tokenizer(args.prompt, add_special_tokens=True)["input_ids"]
        same = hf_ids == ids.tolist()
        print(f"tokenizer: {len(hf_ids)} ids, {'same as' if same else 'DIFFERENT from'} tandem's {len(ids)}")
        ok &= same

    model = AutoModelForCausalLM.from_pretrained(args.export_dir, torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        hf_logits = model(ids[None, :]).logits[0].to(torch.float32)
    if hf_logits.shape != tandem_logits.shape:
        print(f"logits: transformers {tuple(hf_logits.shape)} vs tandem {tuple(tandem_logits.shape)}")
        return 1
    worst = (hf_logits - tandem_logits).abs().max().item()
    largest = tandem_logits.abs().max().item()
    agree = (hf_logits.argmax(-1) == tandem_logits.argmax(-1)).float().mean().item()
    within = worst <= args.atol
    print(f"logits: {tuple(tandem_logits.shape)}, largest |logit| {largest:.4g}, max |transformers - tandem| "
          f"{worst:.3g} (tolerance {args.atol:g}): {'ok' if within else 'FAILED'}; argmax agrees at {agree:.1%} of positions")
    ok &= within
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
