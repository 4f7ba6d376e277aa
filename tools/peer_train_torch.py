"""The peer figure of bench_train: one training step of a random Qwen3-0.6B-shape model in
PyTorch + transformers on the same GPU (8 x 1024 tokens, bf16 autocast, FP32 weights and
AdamW, token log-prob loss), eager and under torch.compile.

    python3 tools/peer_train_torch.py [--steps 10] [--modes eager,compile]

Prints one line per mode: median ms per step over --steps timed steps after 3 warm-ups,
tokens/s and the peak device memory.
"""
import argparse
import statistics

import torch
from peer_model import qwen3_0_6b_config
from transformers import Qwen3ForCausalLM


def step_fn(model, optimizer, ids):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(input_ids=ids).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -logp.mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--modes", default="eager,compile")
    args = parser.parse_args()
    config = qwen3_0_6b_config()
    for mode in args.modes.split(","):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.99), eps=1e-8, fused=True)
        ids = torch.randint(0, config.vocab_size, (8, 1024), device="cuda")
        fn = torch.compile(step_fn) if mode == "compile" else step_fn
        for _ in range(3):
            fn(model, optimizer, ids)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(model, optimizer, ids)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        ms = statistics.median(times)
        print(f"peer {mode}: step {ms:.1f} ms | {8 * 1024 / ms * 1e3:.0f} tokens/s | "
              f"peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB", flush=True)
        del model, optimizer
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
