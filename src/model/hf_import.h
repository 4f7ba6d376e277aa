// Hugging Face model folders in and out: config.json plus model.safetensors (or shards
// with model.safetensors.index.json). Weights are read from the memory-mapped files into
// tandem's FP32 parameter slab, converting BF16/F16 on the way, and written back in the
// dtype the caller picks.
#pragma once
#include <cstddef>
#include <filesystem>

#include "model/config.h"
#include "model/parameters.h"

namespace tandem {

// folder/config.json.
ModelConfig load_hf_config(const std::filesystem::path& folder);

// Fills `params` (FP32, host, bound to a layout of the folder's config) from the folder's
// safetensors. Throws std::runtime_error naming the file and the tensor for a missing
// tensor, a shape that disagrees with the config, a dtype other than F32/BF16/F16, or a
// tensor the layout has no place for (a config/weights mismatch). A tied model's stray
// lm_head.weight and legacy rotary_emb.inv_freq buffers are skipped, as transformers does.
void load_hf_weights(const std::filesystem::path& folder, const ParameterSet& params);

// Writes folder/config.json and the weights in `dtype` (F32, BF16 or F16; BF16 and F16
// round to nearest even): one model.safetensors when max_shard_bytes is 0, otherwise
// shards of at most that size plus the index. A tied model stores no lm_head.weight.
// Each file is written atomically; a stale file of the other form is removed, since
// transformers would load model.safetensors ahead of an index.
void export_hf(const std::filesystem::path& folder, const ParameterSet& params, DType dtype,
               size_t max_shard_bytes = 0);

}  // namespace tandem
