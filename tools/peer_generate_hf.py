"""The peer figure of bench_decode: Hugging Face `generate` of a random Qwen3-0.6B-shape
model on the same GPU, as bench_decode runs tandem's engine (BF16 weights, random
128-token prompts, 256 new tokens each, temperature 1 over the whole vocabulary, no stop).

    python3 tools/peer_generate_hf.py [--batch 256] [--prompt 128] [--new 256] [--runs 2]
                                      [--cache static,dynamic]

Prints one line per cache kind: new tokens per second of the best of --runs timed
generates (after one untimed generate that warms up and, with the static cache, allocates
it), wall clock with the device synchronised, and the peak device memory.
"""
import argparse
import time

import torch
from peer_model import qwen3_0_6b_config
from transformers import Qwen3ForCausalLM


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--cache", default="static")
    args = parser.parse_args()
    config = qwen3_0_6b_config()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    ids = torch.randint(0, config.vocab_size, (args.batch, args.prompt), device="cuda")
    mask = torch.ones_like(ids)
    for cache in args.cache.split(","):
        def generate():
            # min_new_tokens keeps every sequence going for --new tokens, as bench_decode's
            # sequences have no stop token; top_k 0 and top_p 1 sample the whole vocabulary.
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.new,
                                 min_new_tokens=args.new, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 cache_implementation=cache if cache != "dynamic" else None, pad_token_id=0)
            torch.cuda.synchronize()
            return out.shape[1] - args.prompt

        with torch.inference_mode():
            generate()
            torch.cuda.reset_peak_memory_stats()
            best = float("inf")
            for _ in range(args.runs):
                start = time.perf_counter()
                new = generate()
                best = min(best, time.perf_counter() - start)
        if new != args.new:
            raise SystemExit(f"peer {cache}: generated {new} new tokens a sequence, not {args.new}")
        print(f"peer hf generate ({cache} cache): {args.batch * args.new / best:.0f} new tokens/s "
              f"({best:.3f} s a generate) | batch {args.batch}, prompt {args.prompt}, new {args.new} | "
              f"peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
