// Hugging Face folders out and back in: F32 bit-exact, BF16/F16 rounded to nearest even,
// single file or sharded, and every kind of mismatch refused naming the file and tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/hf_import.h"
#include "support.h"
#include "test_model_support.h"

using namespace tandem;
using namespace tandem::testing;

namespace {

struct HostModel {
  explicit HostModel(const ModelConfig& config) : layout(config), slab(layout.slab_elements()) {
    params = ParameterSet::bind(layout, slab.data(), DType::F32);
  }
  ParameterLayout layout;
  std::vector<float> slab;
  ParameterSet params;
};

ModelConfig tiny(Architecture arch) {
  ModelConfig config = tiny_config(arch == Architecture::Qwen3, arch == Architecture::Qwen2, arch != Architecture::Llama);
  config.arch = arch;
  return config;
}

std::string load_error(const std::filesystem::path& folder, const ModelConfig& config) {
  HostModel model(config);
  try {
    load_hf_weights(folder, model.params);
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  return "accepted";
}

// Writes an F32 checkpoint of `model`, with `edit` free to drop, add or change tensors.
void write_checkpoint(const std::filesystem::path& path, const HostModel& model,
                      const std::function<void(std::vector<SafetensorsTensor>&)>& edit) {
  std::vector<SafetensorsTensor> tensors;
  for (size_t i = 0; i < model.layout.tensors().size(); ++i) {
    const ParameterInfo& info = model.layout.tensors()[i];
    tensors.push_back({info.name, DType::F32, info.shape, model.params.all[i].data});
  }
  edit(tensors);
  write_safetensors(path, tensors);
}

TEST(ModelHfImport, F32ExportLoadsBackBitExactWithItsConfig) {
  for (Architecture arch : {Architecture::Qwen3, Architecture::Qwen2, Architecture::Llama}) {
    TempDir dir;
    HostModel model(tiny(arch));
    randomize(model.params, 3);
    export_hf(dir.path(), model.params, DType::F32);
    EXPECT_TRUE(std::filesystem::exists(dir / "model.safetensors"));

    const ModelConfig config = load_hf_config(dir.path());
    EXPECT_EQ(config.arch, arch);
    EXPECT_EQ(config.head_dim, 6);
    EXPECT_EQ(config.tie_embeddings, arch != Architecture::Llama);
    HostModel loaded(config);
    load_hf_weights(dir.path(), loaded.params);
    EXPECT_EQ(loaded.slab, model.slab);

    const SafetensorsFile file(dir / "model.safetensors");
    EXPECT_EQ(file.metadata().at("format"), "pt");
    EXPECT_EQ(file.find("lm_head.weight") != nullptr, arch == Architecture::Llama);
  }
}

TEST(ModelHfImport, HalfPrecisionExportsRoundToNearestEven) {
  TempDir dir;
  HostModel model(tiny(Architecture::Qwen3));
  randomize(model.params, 4);
  float* embed = model.params.embed_tokens.ptr<float>();
  // Exact halfway cases go to the even neighbour; 65504 is the largest F16, 2^-24 its
  // smallest subnormal, 1e6 overflows it.
  const float probes[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 65504.0f, 0x1p-24f, -3 * 0x1p-25f, 1e6f, -0.0f};
  std::copy(std::begin(probes), std::end(probes), embed);

  export_hf(dir / "bf16", model.params, DType::BF16);
  EXPECT_EQ(nlohmann::json::parse(read_text(dir / "bf16" / "config.json")).at("dtype"), "bfloat16");
  HostModel bf16(load_hf_config(dir / "bf16"));
  load_hf_weights(dir / "bf16", bf16.params);
  const float* b = bf16.params.embed_tokens.ptr<float>();
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], 1.015625f);
  EXPECT_EQ(b[2], 65536.0f);
  EXPECT_EQ(b[3], 0x1p-24f);
  EXPECT_EQ(b[5], 999424.0f);
  for (size_t e = 0; e < bf16.slab.size(); ++e)
    ASSERT_NEAR(bf16.slab[e], model.slab[e], std::fabs(model.slab[e]) * 0x1p-8f) << "element " << e;

  // 1e6 overflows F16 to +Inf, and the loader refuses a non-finite weight by name.
  export_hf(dir / "f16", model.params, DType::F16);
  HostModel f16(load_hf_config(dir / "f16"));
  try {
    load_hf_weights(dir / "f16", f16.params);
    FAIL() << "loaded an infinite weight";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("tensor 'model.embed_tokens.weight': element 5 of"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("is +Inf"), std::string::npos) << error.what();
  }
  embed[5] = 2.0f;
  std::filesystem::remove_all(dir / "f16");
  export_hf(dir / "f16", model.params, DType::F16);
  load_hf_weights(dir / "f16", f16.params);
  const float* h = f16.params.embed_tokens.ptr<float>();
  EXPECT_EQ(h[0], 1.0f + 0x1p-8f);  // representable in F16 (10 mantissa bits)
  EXPECT_EQ(h[2], 65504.0f);
  EXPECT_EQ(h[3], 0x1p-24f);
  EXPECT_EQ(h[4], -0x1p-23f);  // -1.5 ulp of the subnormal grid rounds to the even -2 ulp
  EXPECT_EQ(h[5], 2.0f);
  EXPECT_TRUE(std::signbit(h[6]));
  for (size_t e = 7; e < f16.slab.size(); ++e)
    ASSERT_NEAR(f16.slab[e], model.slab[e], std::fabs(model.slab[e]) * 0x1p-11f + 0x1p-24f) << "element " << e;

  // A checkpoint read back and exported again in its own dtype is byte-identical.
  export_hf(dir / "bf16-again", bf16.params, DType::BF16);
  const SafetensorsFile first(dir / "bf16" / "model.safetensors"), second(dir / "bf16-again" / "model.safetensors");
  for (const auto& entry : first.entries())
    EXPECT_EQ(std::memcmp(first.bytes(entry.name).data(), second.bytes(entry.name).data(), entry.bytes), 0) << entry.name;
}

TEST(ModelHfImport, ShardedExportReplacesTheSingleFileAndLoads) {
  TempDir dir;
  HostModel model(tiny(Architecture::Llama));
  randomize(model.params, 5);
  export_hf(dir.path(), model.params, DType::F32);
  export_hf(dir.path(), model.params, DType::F32, 4096);
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  EXPECT_TRUE(SafetensorsCheckpoint(dir.path()).sharded());
  HostModel loaded(load_hf_config(dir.path()));
  load_hf_weights(dir.path(), loaded.params);
  EXPECT_EQ(loaded.slab, model.slab);

  export_hf(dir.path(), model.params, DType::F32);
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.index.json"));
}

TEST(ModelHfImport, MismatchesNameTheFileAndTheTensor) {
  TempDir dir;
  const ModelConfig config = tiny(Architecture::Qwen3);
  HostModel model(config);
  randomize(model.params, 6);
  const auto path = dir / "model.safetensors";
  const std::string file = path.string();

  write_checkpoint(path, model, [](auto& tensors) { std::erase_if(tensors, [](auto& t) { return t.name == "model.layers.1.self_attn.k_norm.weight"; }); });
  std::string message = load_error(dir.path(), config);
  EXPECT_NE(message.find(file + ": tensor 'model.layers.1.self_attn.k_norm.weight' [6] is missing"), std::string::npos) << message;

  write_checkpoint(path, model, [](auto& tensors) {
    for (auto& t : tensors)
      if (t.name == "model.layers.0.mlp.up_proj.weight") t.shape = {16, 24};
  });
  message = load_error(dir.path(), config);
  EXPECT_NE(message.find(file + ": tensor 'model.layers.0.mlp.up_proj.weight' has shape [16,24] but config.json implies [24,16]"),
            std::string::npos) << message;

  write_checkpoint(path, model, [](auto& tensors) {
    for (auto& t : tensors)
      if (t.name == "model.norm.weight") t.dtype = DType::I32;
  });
  message = load_error(dir.path(), config);
  EXPECT_NE(message.find(file + ": tensor 'model.norm.weight' has dtype I32"), std::string::npos) << message;

  const std::vector<float> bias(16);
  write_checkpoint(path, model, [&](auto& tensors) {
    tensors.push_back({"model.layers.0.self_attn.o_proj.bias", DType::F32, {16}, bias.data()});
  });
  message = load_error(dir.path(), config);
  EXPECT_NE(message.find(file + ": tensor 'model.layers.0.self_attn.o_proj.bias' is not part of a Qwen3ForCausalLM"),
            std::string::npos) << message;

  // What transformers itself skips: a tied model's lm_head copy and old rotary buffers.
  const std::vector<float> head(32 * 16), inv_freq(3);
  write_checkpoint(path, model, [&](auto& tensors) {
    tensors.push_back({"lm_head.weight", DType::F32, {32, 16}, head.data()});
    tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::F32, {3}, inv_freq.data()});
  });
  HostModel loaded(config);
  load_hf_weights(dir.path(), loaded.params);
  EXPECT_EQ(loaded.slab, model.slab);
}

TEST(ModelHfImport, RefusesNonHostOrNonF32ParametersAndOtherExportDtypes) {
  TempDir dir;
  HostModel model(tiny(Architecture::Llama));
  EXPECT_THROW(export_hf(dir.path(), model.params, DType::F8_E4M3), std::invalid_argument);
  std::vector<uint16_t> halves(model.layout.slab_elements());
  const ParameterSet bf16 = ParameterSet::bind(model.layout, halves.data(), DType::BF16);
  EXPECT_THROW(export_hf(dir.path(), bf16, DType::BF16), std::invalid_argument);
  EXPECT_THROW(load_hf_weights(dir.path(), bf16), std::invalid_argument);
}

}  // namespace
