// The one table of deck options. Add an option with one line here:
//   {key, type, default, unit, help, range, choices}
#include "deck/options.h"

namespace tandem {

const std::vector<OptionSpec>& tandem_options() {
  using enum OptionType;
  static const std::vector<OptionSpec> options = {
      {"run.name", String, "default", "", "name of this run; its files go to <output-dir>/<name>"},
      {"run.output-dir", String, "runs", "", "folder that holds the run folders"},
      {"run.seed", Int, "1234", "", "seed of every random stream (model init, data order, sampling)", at_least(0)},
      {"run.steps", Int, "20", "steps", "GRPO steps to run", at_least(0)},
      {"run.restart", String, "auto", "", "auto = resume from the run folder's newest checkpoint if any, never = start fresh, or a checkpoint file"},
      {"run.checkpoint-every", Int, "5", "steps", "write a checkpoint every this many steps; 0 = never", at_least(0)},
      {"run.steps-per-job", Int, "0", "steps", "stop this job after so many steps, with a checkpoint; the next job resumes (restart = auto); 0 = run to the end", at_least(0)},
      {"run.samples-every", Int, "50", "steps", "store rank 0's rollout samples (tokens and their text, rollout, train and reference log-probs, entropy, advantage, reward) in the run file every this many steps, for report.html's token view and h5py; 0 = never", at_least(0)},
      // report.html (issue 14)
      {"run.report-every", Int, "0", "steps", "rewrite <run folder>/report.html every this many steps; it is written at the end of the run in any case; 0 = only then", at_least(0)},
      {"run.report-sample-steps", Int, "8", "steps", "report.html's token view holds the samples of the latest this many steps that stored samples; 0 = all", at_least(0)},
      {"run.keep-checkpoints", Int, "3", "", "checkpoints kept in the run folder; older ones are deleted", at_least(1)},
      {"run.max-time", Seconds, "0", "", "stop cleanly with a checkpoint before this much time since the start has passed, allowing for a step and a checkpoint (like GROMACS -maxh); 0 = under Slurm the job's end time, else no limit", at_least(0)},
      // Checkpoints off the step's critical path (issue 16)
      {"run.checkpoint-async", Bool, "true", "", "write each checkpoint from a host snapshot on a background thread while training goes on; rank 0 then holds one host copy of the master weights and optimizer state (12 bytes a parameter under AdamW, pinned on CUDA) from the first checkpoint on. false = the step waits for the write"},

      {"world.device", Choice, "auto", "", "where to compute; auto = cuda when a GPU is visible, else cpu", {}, {"auto", "cpu", "cuda"}},
      {"world.log-level", Choice, "info", "", "least severe message written to the log", {}, {"trace", "debug", "info", "warning", "error"}},
      {"world.log-all-ranks", Bool, "false", "", "ranks other than 0 log at log-level too, not just warnings and errors"},
      {"world.threads", Int, "0", "", "CPU threads per rank; 0 = the cores of the node divided among its ranks", at_least(0)},
      {"world.stall-timeout", Seconds, "10min", "", "a rank that does not reach one of the step's collectives this long after the others is reported by rank and collective, and the job ends; 0 = wait forever", at_least(0)},
      // rollout ranks apart from trainer ranks (issue 12)
      {"world.rollout-ranks", Int, "0", "ranks", "the last this many ranks run rollout engines only and the others train only; 0 = every rank trains and generates (colocated)", at_least(0)},

      {"memory.offload-train", Bool, "true", "", "move the trainer's weights, gradients and optimizer state to host memory during rollout"},
      {"memory.offload-rollout", Bool, "true", "", "release the rollout engine's GPU memory during training"},
      {"memory.offload-rollout-level", List, "kv_cache,weight", "", "what the rollout engine releases when it offloads", {}, {"kv_cache", "weight"}},
      {"memory.colocate-memory-peak-device", Choice, "cpu", "", "where the handoff's memory peak lands: cpu = host briefly holds both weight copies, gpu = the GPU does (needs both offloads)", {}, {"cpu", "gpu"}},
      {"memory.pinned-host-cache", Bool, "true", "", "keep pinned host buffers between offloads instead of freeing them"},

      {"memory.host-limit", Bytes, "0", "bytes", "host memory a rank may use; 0 = the cgroup's memory.max, else MemTotal. A predicted host peak above it stops the job at start-up", {}},
      {"sync.transport", Choice, "alias", "", "how the trainer's weights reach the engines: alias = the engine reads the trainer's working copy (0 bytes per sync), copy = the engine has its own copy, rewritten each sync, disk-delta = the trainer ranks write compressed, checksummed deltas against a baseline to the shared folder sync.path and the engines (colocated, or on rollout ranks) read them; broadcast = trainer rank 0 broadcasts the working-dtype weights to the rollout ranks (world.rollout-ranks > 0). Colocated ranks take alias, copy or disk-delta; rollout ranks broadcast or disk-delta", {}, {"alias", "copy", "disk-delta", "broadcast"}},
      {"sync.path", Path, "", "", "disk-delta: the folder every rank sees that holds the versions (weight_v000001/ ...); empty = <run folder>/weights"},
      {"sync.baseline", Path, "", "", "disk-delta: the HF safetensors folder the engines start from (version 0, the base of the first version), loaded by the trainers and the engines; empty = the run's initial weights (model.path or the seeded random model) in the working dtype"},
      {"sync.delta-encoding", Choice, "xor", "", "disk-delta: xor = previous ^ new bytes, overwrite = the changed elements' positions and values (idempotent)", {}, {"xor", "overwrite"}},
      {"sync.compression-level", Int, "1", "", "disk-delta: zstd level of the deltas", between(1, 22)},
      {"sync.keep-versions", Int, "2", "", "disk-delta: published versions kept in sync.path; older ones are deleted. Each is a delta against the one before: a reader rebuilds the newest from the baseline and every version since, or from the version it holds and those after it", at_least(1)},
      // the broadcast to rollout ranks (issue 12)
      {"sync.bucket-bytes", Bytes, "512MiB", "bytes", "broadcast: the weights go out in buckets of this size", at_least(1)},

      {"rollout.kv-cache", Bytes, "16MiB", "bytes", "KV cache of the rollout engine on each rank", {}},
      {"rollout.kv-cache-fraction", Double, "0", "", "when > 0, size the KV cache as this fraction of the free memory of the rank's device instead", between(0, 0.95)},
      {"rollout.kv-cache-dtype", Choice, "auto", "", "what the KV cache holds: auto = keys and values in the working dtype (model.dtype); fp8 = FP8 E4M3 codes with an FP32 scale per token and head, 0.52x the bytes of BF16: about twice the tokens in the same memory, and faster decoding, whose attention reads every cached byte each step. The samples then come from keys and values rounded to 3 mantissa bits, so the rollout log-probs move away from the trainer's a little; the importance ratio carries the difference", {}, {"auto", "fp8"}},
      {"rollout.weight-dtype", Choice, "auto", "", "what the engine's q|k|v, gate|up and down projections compute in: auto = the working dtype (model.dtype); fp8 = FP8 E4M3 tensor-core products, each weight matrix as codes of one scale (made from the trainer's weights at the start of each rollout) and each token's input as codes of its own scale: half the weight bytes and twice the tensor rate of BF16, for a faster decode. o_proj and the LM head stay in the working dtype. The samples then come from weights and activations rounded to 3 mantissa bits, so the rollout log-probs move away from the trainer's; the importance ratio carries the difference. Needs every layer's q|k|v stacked without biases (Qwen3, Llama)", {}, {"auto", "fp8"}},
      {"rollout.max-step-tokens", Int, "2048", "tokens", "new tokens in one engine step (prompt chunks + decodes): longer prompts are prefilled in chunks", at_least(1)},
      {"rollout.share-prompts", Bool, "true", "", "samples whose prompts begin alike (a GRPO group's) share the KV cache blocks of the prompt's whole blocks: prefilled once, held and read as one copy"},
      {"rollout.max-staleness", Int, "0", "steps", "how old the policy that samples a step's first round may be: 0 = the weights the step trains; 1 = the engines sample step k+1 with the weights of step k-1 while the trainers train step k (needs world.rollout-ranks > 0). The importance ratio against the rollout log-probs corrects for the older policy. A scheduled checkpoint's step orders nothing ahead, so a restart from it is bit-exact; a stop drops the round ordered ahead, and the resumed job samples it afresh", between(0, 1)},

      {"task.name", Choice, "arithmetic", "", "the verifiable task the policy is trained on; jsonl = prompts from task.path (needs model.path's tokenizer)", {}, {"arithmetic", "countdown", "jsonl"}},
      {"task.path", Path, "", "", "JSONL prompt file of task.name = jsonl: one {\"prompt\": ..., \"answer\": ...} object a line, read in an order shuffled by run.seed"},
      {"task.reward", Choice, "exact", "", "how a jsonl completion is judged: its whole text, its last number, or its last \\boxed{} against the answer", {}, {"exact", "last-number", "boxed"}},
      {"task.thinking", Bool, "false", "", "chat prompts of a pretrained model let it think first; false appends the empty <think></think> block that turns Qwen3's thinking off"},
      {"task.digits", Int, "1", "", "digits of each arithmetic operand", between(1, 9)},
      {"task.numbers", Int, "3", "", "numbers given in each countdown puzzle", between(2, 6)},
      {"task.max-number", Int, "20", "", "largest number a countdown puzzle gives", at_least(1)},
      {"task.max-target", Int, "100", "", "largest countdown target", at_least(1)},
      {"task.operations", String, "+", "", "arithmetic operations to draw from, a subset of +-*"},
      {"task.prompts-per-step", Int, "16", "prompts", "prompts each rank samples per step", at_least(1)},

      {"grpo.group-size", Int, "8", "samples", "completions sampled per prompt (G)", at_least(1)},
      {"grpo.max-new-tokens", Int, "4", "tokens", "longest completion", at_least(1)},
      {"grpo.temperature", Double, "1.0", "", "sampling temperature; log-probs are taken at the same temperature", above(0)},
      {"grpo.lr", Double, "2e-3", "", "peak learning rate of the RL phase; 0 = the policy samples and is scored but never changes", at_least(0)},
      {"grpo.warmup-steps", Int, "2", "steps", "linear learning-rate warm-up of the RL phase", at_least(0)},
      {"grpo.eps-low", Double, "0.2", "", "lower clip of the importance ratio: 1 - eps-low", at_least(0)},
      {"grpo.eps-high", Double, "0.28", "", "upper clip of the importance ratio: 1 + eps-high", at_least(0)},
      {"grpo.loss-aggregation", Choice, "token-mean", "", "how token losses are averaged", {}, {"token-mean", "seq-mean-token-mean", "global-token-sum"}},
      {"grpo.kl-coef", Double, "0", "", "weight of the KL penalty to the frozen initial policy; 0 = no reference model", at_least(0)},
      {"grpo.kl-estimator", Choice, "k3", "", "KL estimator on the sampled tokens", {}, {"k1", "k3"}},
      {"grpo.entropy-coef", Double, "0", "", "weight of the entropy bonus", at_least(0)},
      {"grpo.std-normalisation", Bool, "true", "", "divide advantages by the group's reward std (false: Dr. GRPO)"},
      {"grpo.max-grad-norm", Double, "1.0", "", "gradient-norm clipping; 0 = off", at_least(0)},
      {"grpo.dynamic-sampling", Bool, "false", "", "drop prompt groups whose rewards are all equal (zero advantage) and draw more prompts until the batch is full (DAPO)"},
      {"grpo.dynamic-sampling-rounds", Int, "4", "rounds", "most rounds of prompts-per-step prompts a step draws under dynamic sampling; short of a full batch after them, it tops up with flat groups and warns", at_least(1)},
      {"grpo.over-sampling-groups", Int, "0", "prompts", "over-sampling under dynamic sampling: each round draws this many prompts per trainer rank (at least task.prompts-per-step) and ends as soon as its first groups in prompt order decide the batch; rollout ranks abort the requests of the rest, and the step counts and consumes only the groups up to the one that fills the batch; 0 = rounds of prompts-per-step prompts, drawn whole", at_least(0)},

      {"sft.steps", Int, "0", "steps", "supervised warm-up steps on generated solutions before the RL phase", at_least(0)},
      {"sft.lr", Double, "3e-3", "", "learning rate of the supervised warm-up", above(0)},

      {"train.on-nonfinite", Choice, "stop", "", "a step whose gradients hold NaN or Inf: stop = end the job (exit 3) after a checkpoint of the last good weights, skip = drop its update with a warning (counted in the run file's skipped column)", {}, {"stop", "skip"}},

      {"train.shard-optimizer", Bool, "false", "", "ZeRO-1: each trainer rank holds only its shard of the FP32 master weights and optimizer state (gradients reduce-scattered, the working copy all-gathered; under Muon each matrix has one owner rank); needs sync.transport = alias"},

      {"train.micro-batch-tokens", Int, "0", "tokens", "tokens per forward/backward pass; gradients add up over the micro-batches of a step; 0 = the whole batch at once", at_least(0)},

      {"model.path", String, "", "", "Hugging Face model folder (config.json, safetensors, tokenizer.json), read at start-up, not by --check; empty = tandem creates a tiny random model from the sizes below"},
      {"model.layers", Int, "2", "", "transformer layers", between(1, 512)},
      {"model.hidden", Int, "64", "", "hidden size", at_least(1)},
      {"model.heads", Int, "4", "", "query heads", at_least(1)},
      {"model.kv-heads", Int, "2", "", "key/value heads (grouped-query attention)", at_least(1)},
      {"model.head-dim", Int, "16", "", "size of one attention head", at_least(1)},
      {"model.intermediate", Int, "128", "", "MLP intermediate size", at_least(1)},
      {"model.vocab", Int, "64", "", "vocabulary size", at_least(1)},
      {"model.tie-embeddings", Bool, "true", "", "the output projection shares the token embedding"},
      {"model.rope-theta", Double, "10000", "", "RoPE base frequency", above(0)},
      {"model.rms-eps", Double, "1e-6", "", "epsilon of RMSNorm", above(0)},
      {"model.qk-norm", Bool, "true", "", "RMSNorm on queries and keys per head (Qwen3)"},
      {"model.dtype", Choice, "bf16", "", "working precision on CUDA; CPU always computes in f32", {}, {"f32", "bf16"}},

      {"optimizer.name", Choice, "adamw", "", "adamw for every tensor, or muon for the layers' 2-D matrices (q, k, v, o, gate, up, down) with adamw for embeddings, LM head, norms and biases; the learning rates stay grpo.lr and sft.lr", {}, {"adamw", "muon"}},
      {"optimizer.betas", String, "0.9,0.99", "", "AdamW's beta1,beta2, each in [0, 1)"},
      {"optimizer.eps", Double, "1e-8", "", "AdamW's epsilon", above(0)},
      {"optimizer.weight-decay", Double, "0", "", "decoupled weight decay of the 2-D matrices (AdamW's and Muon's)", at_least(0)},
      {"optimizer.momentum", Double, "0.95", "", "Muon's Nesterov momentum", between(0, 1)},
      {"optimizer.state", Choice, "device", "", "where the optimizer state lives: device = beside the master weights (offloaded with them); host = host memory (pinned on CUDA); disk = a file-backed shared mapping, one file per rank under state-path, whose pages the kernel writes back and reclaims. With host or disk each step streams the state through the device in chunks of chunk-bytes", {}, {"device", "host", "disk"}},
      {"optimizer.chunk-bytes", Bytes, "64MiB", "bytes", "state = host | disk: the size of each of the two device staging slots the state streams through (at least 1 KiB; under Muon at least its largest matrix)", at_least(1024)},
      {"optimizer.state-path", String, "", "", "folder of the per-rank state files of state = disk, a local disk; empty = the run folder"},
  };
  return options;
}

}  // namespace tandem
