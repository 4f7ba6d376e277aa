// Which explicitly configured cuBLASLt algorithm is fastest for the rollout engine's decode
// GEMMs, against the heuristic's first pick that kernels/matmul.cu runs.
//
//   bench_gemm_configs [--tokens 64,256] [--max-configs 400] [--refine 200] [--calls 50]
//                      [--launches 5] [--top 5] [--csv FILE]
//
// The GEMMs are the four of a Qwen3-0.6B decode layer, out[M,O] = x[M,I]·W[O,I]ᵀ at M
// tokens (--tokens): qkv 1024->4096, o 2048->1024, gate|up 1024->6144, down 3072->1024, BF16
// with FP32 accumulation, in matmul_forward's layout (cuBLASLt column-major outᵀ[O,M] =
// Wᵀ·x: trans_a T, trans_b N, m = O, n = M, k = I; beta 0, no bias). Each is timed with
//   (a) the heuristic's first pick, built as matmul.cu builds it (32 MiB of workspace,
//       16-byte alignments), beside matmul_forward itself to show the replica is exact, and
//       the pick rebuilt from its attributes (cublasLtMatmulAlgoInit + ConfigSetAttribute:
//       what a fixed rule would run);
//   (b) every candidate the heuristic returns when asked for 32;
//   (c) a sweep: every algorithm id the device has for these types, each tile it supports,
//       split-K in {1,2,3,4,6,8,12,16} with each reduction scheme it supports, at one stage
//       count and the automatic cluster shape (up to --max-configs, the most promising of each
//       tile first: unsplit, then the split counts that bring the grid nearest one wave);
//       then, around the 5 fastest so far, the other stage counts, cluster shapes, CTA
//       swizzling, custom options and split counts, one attribute at a time (up to --refine).
//       Configs cublasLtMatmulAlgoCheck rejects, or that want over 32 MiB of workspace, are
//       skipped; so are those cublasLtMatmul refuses (NOT_SUPPORTED and the like), counted.
// Timing follows the decode step: W comes from HBM, not the H200's 50 MB L2 (the calls rotate
// over copies of W worth at least 128 MiB), while x, just written by the previous kernel,
// stays in L2. --calls GEMMs are captured in one CUDA graph (the engine replays its decode
// step from graphs); the figure is the median of --launches launches over the calls, in us.
// Correctness: each config's output is compared with the pick's (max |diff| / max |pick|);
// over 2e-2, or any NaN (the output is filled with NaN first, so a kernel that skips part of
// it shows), is WRONG and left out of the ranking. Each config runs 3 times on the same
// inputs: "repro" says whether the 3 outputs are bitwise equal, "same" whether they equal the
// pick's bits. Output: per GEMM the pick, the heuristic's fastest candidate, the sweep's
// counts and the --top fastest configs, then one `shape ...` line per GEMM (and a
// `shape-repro ...` line when the fastest config was not reproducible); --csv FILE writes
// every timed config.
#include <cstdio>

#ifdef TANDEM_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "matmul.cuh"
#include "tensor/bf16.h"

using namespace tandem;

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // matmul.cu's workspace
constexpr uint32_t kAlignment = 16;                   // and its alignment promise
constexpr size_t kRotationBytes = size_t{128} << 20;  // weight copies per GEMM: 2.5x the L2
constexpr double kTolerance = 2e-2;                   // a BF16 ulp is 2^-8 = 3.9e-3 of a value
constexpr int kRuns = 3;                              // correctness + reproducibility runs
constexpr int kSeeds = 5;                             // configs the refine phase varies
constexpr int kMaxHeuristic = 32;
constexpr int kSplits[] = {2, 3, 4, 6, 8, 12, 16};
// Reduction schemes in the order tried: FP32 partials first (the most accurate).
constexpr uint32_t kReductions[] = {CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, CUBLASLT_REDUCTION_SCHEME_INPLACE,
                                    CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE};
// Cluster shapes the refine phase tries: the output has few tiles, too few for larger clusters.
constexpr uint16_t kClusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO,  CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                  CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1,
                                  CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
                                  CUBLASLT_CLUSTER_SHAPE_1x4x1};

// ---------------------------------------------------------------------------------------
// Human names of cuBLASLt's enum values. Each entry names its enumerator, so the compiler
// checks the table against the header; a value the table lacks prints as its number.

struct Name {
  int value;
  const char* name;
};

// clang-format off
#define T(n) {CUBLASLT_MATMUL_TILE_##n, #n}
constexpr Name kTileNames[] = {
    T(8x8), T(8x16), T(16x8), T(8x32), T(16x16), T(32x8), T(8x64), T(16x32), T(32x16), T(64x8), T(32x32), T(32x64),
    T(64x32), T(32x128), T(64x64), T(128x32), T(64x128), T(128x64), T(64x256), T(128x128), T(256x64), T(64x512),
    T(128x256), T(256x128), T(512x64), T(64x96), T(96x64), T(96x128), T(128x160), T(160x128), T(192x128), T(128x192),
    T(128x96), T(32x256), T(256x32), T(8x128), T(8x192), T(8x256), T(8x320), T(8x384), T(8x448), T(8x512), T(8x576),
    T(8x640), T(8x704), T(8x768), T(16x64), T(16x128), T(16x192), T(16x256), T(16x320), T(16x384), T(16x448),
    T(16x512), T(16x576), T(16x640), T(16x704), T(16x768), T(24x64), T(24x128), T(24x192), T(24x256), T(24x320),
    T(24x384), T(24x448), T(24x512), T(24x576), T(24x640), T(24x704), T(24x768), T(32x192), T(32x320), T(32x384),
    T(32x448), T(32x512), T(32x576), T(32x640), T(32x704), T(32x768), T(40x64), T(40x128), T(40x192), T(40x256),
    T(40x320), T(40x384), T(40x448), T(40x512), T(40x576), T(40x640), T(40x704), T(40x768), T(48x64), T(48x128),
    T(48x192), T(48x256), T(48x320), T(48x384), T(48x448), T(48x512), T(48x576), T(48x640), T(48x704), T(48x768),
    T(56x64), T(56x128), T(56x192), T(56x256), T(56x320), T(56x384), T(56x448), T(56x512), T(56x576), T(56x640),
    T(56x704), T(56x768), T(64x192), T(64x320), T(64x384), T(64x448), T(64x576), T(64x640), T(64x704), T(64x768),
    T(72x64), T(72x128), T(72x192), T(72x256), T(72x320), T(72x384), T(72x448), T(72x512), T(72x576), T(72x640),
    T(80x64), T(80x128), T(80x192), T(80x256), T(80x320), T(80x384), T(80x448), T(80x512), T(80x576), T(88x64),
    T(88x128), T(88x192), T(88x256), T(88x320), T(88x384), T(88x448), T(88x512), T(96x192), T(96x256), T(96x320),
    T(96x384), T(96x448), T(96x512), T(104x64), T(104x128), T(104x192), T(104x256), T(104x320), T(104x384),
    T(104x448), T(112x64), T(112x128), T(112x192), T(112x256), T(112x320), T(112x384), T(120x64), T(120x128),
    T(120x192), T(120x256), T(120x320), T(120x384), T(128x320), T(128x384), T(136x64), T(136x128), T(136x192),
    T(136x256), T(136x320), T(144x64), T(144x128), T(144x192), T(144x256), T(144x320), T(152x64), T(152x128),
    T(152x192), T(152x256), T(152x320), T(160x64), T(160x192), T(160x256), T(168x64), T(168x128), T(168x192),
    T(168x256), T(176x64), T(176x128), T(176x192), T(176x256), T(184x64), T(184x128), T(184x192), T(184x256),
    T(192x64), T(192x192), T(192x256), T(200x64), T(200x128), T(200x192), T(208x64), T(208x128), T(208x192),
    T(216x64), T(216x128), T(216x192), T(224x64), T(224x128), T(224x192), T(232x64), T(232x128), T(232x192),
    T(240x64), T(240x128), T(240x192), T(248x64), T(248x128), T(248x192), T(256x192), T(264x64), T(264x128),
    T(272x64), T(272x128), T(280x64), T(280x128), T(288x64), T(288x128), T(296x64), T(296x128), T(304x64), T(304x128),
    T(312x64), T(312x128), T(320x64), T(320x128), T(328x64), T(328x128), T(336x64), T(336x128), T(344x64), T(344x128),
    T(352x64), T(352x128), T(360x64), T(360x128), T(368x64), T(368x128), T(376x64), T(376x128), T(384x64), T(384x128),
    T(392x64), T(400x64), T(408x64), T(416x64), T(424x64), T(432x64), T(440x64), T(448x64), T(456x64), T(464x64),
    T(472x64), T(480x64), T(488x64), T(496x64), T(504x64), T(520x64), T(528x64), T(536x64), T(544x64), T(552x64),
    T(560x64), T(568x64), T(576x64), T(584x64), T(592x64), T(600x64), T(608x64), T(616x64), T(624x64), T(632x64),
    T(640x64), T(648x64), T(656x64), T(664x64), T(672x64), T(680x64), T(688x64), T(696x64), T(704x64), T(712x64),
    T(720x64), T(728x64), T(736x64), T(744x64), T(752x64), T(760x64), T(768x64), T(64x16), T(64x24), T(64x40),
    T(64x48), T(64x56), T(64x72), T(64x80), T(64x88), T(64x104), T(64x112), T(64x120), T(64x136), T(64x144),
    T(64x152), T(64x160), T(64x168), T(64x176), T(64x184), T(64x200), T(64x208), T(64x216), T(64x224), T(64x232),
    T(64x240), T(64x248), T(64x264), T(64x272), T(64x280), T(64x288), T(64x296), T(64x304), T(64x312), T(64x328),
    T(64x336), T(64x344), T(64x352), T(64x360), T(64x368), T(64x376), T(64x392), T(64x400), T(64x408), T(64x416),
    T(64x424), T(64x432), T(64x440), T(64x456), T(64x464), T(64x472), T(64x480), T(64x488), T(64x496), T(64x504),
    T(64x520), T(64x528), T(64x536), T(64x544), T(64x552), T(64x560), T(64x568), T(64x584), T(64x592), T(64x600),
    T(64x608), T(64x616), T(64x624), T(64x632), T(64x648), T(64x656), T(64x664), T(64x672), T(64x680), T(64x688),
    T(64x696), T(64x712), T(64x720), T(64x728), T(64x736), T(64x744), T(64x752), T(64x760), T(128x8), T(128x16),
    T(128x24), T(128x40), T(128x48), T(128x56), T(128x72), T(128x80), T(128x88), T(128x104), T(128x112), T(128x120),
    T(128x136), T(128x144), T(128x152), T(128x168), T(128x176), T(128x184), T(128x200), T(128x208), T(128x216),
    T(128x224), T(128x232), T(128x240), T(128x248), T(128x264), T(128x272), T(128x280), T(128x288), T(128x296),
    T(128x304), T(128x312), T(128x328), T(128x336), T(128x344), T(128x352), T(128x360), T(128x368), T(128x376),
    T(128x392), T(128x400), T(128x408), T(128x416), T(128x424), T(128x432), T(128x440), T(128x448), T(128x456),
    T(128x464), T(128x472), T(128x480), T(128x488), T(128x496), T(128x504), T(128x512), T(192x8), T(192x16),
    T(192x24), T(192x32), T(192x40), T(192x48), T(192x56), T(192x72), T(192x80), T(192x88), T(192x96), T(192x104),
    T(192x112), T(192x120), T(192x136), T(192x144), T(192x152), T(192x160), T(192x168), T(192x176), T(192x184),
    T(192x200), T(192x208), T(192x216), T(192x224), T(192x232), T(192x240), T(192x248), T(192x264), T(192x272),
    T(192x280), T(192x288), T(192x296), T(192x304), T(192x312), T(192x320), T(192x328), T(192x336), T(256x8),
    T(256x16), T(256x24), T(256x40), T(256x48), T(256x56), T(256x72), T(256x80), T(256x88), T(256x96), T(256x104),
    T(256x112), T(256x120), T(256x136), T(256x144), T(256x152), T(256x160), T(256x168), T(256x176), T(256x184),
    T(256x200), T(256x208), T(256x216), T(256x224), T(256x232), T(256x240), T(256x248), T(256x256), T(320x8),
    T(320x16), T(320x24), T(320x32), T(320x40), T(320x48), T(320x56), T(320x72), T(320x80), T(320x88), T(320x96),
    T(320x104), T(320x112), T(320x120), T(320x136), T(320x144), T(320x152), T(320x160), T(320x168), T(320x176),
    T(320x184), T(320x192), T(320x200), T(384x8), T(384x16), T(384x24), T(384x32), T(384x40), T(384x48), T(384x56),
    T(384x72), T(384x80), T(384x88), T(384x96), T(384x104), T(384x112), T(384x120), T(384x136), T(384x144),
    T(384x152), T(384x160), T(384x168), T(448x8), T(448x16), T(448x24), T(448x32), T(448x40), T(448x48), T(448x56),
    T(448x72), T(448x80), T(448x88), T(448x96), T(448x104), T(448x112), T(448x120), T(448x128), T(448x136),
    T(448x144), T(512x8), T(512x16), T(512x24), T(512x32), T(512x40), T(512x48), T(512x56), T(512x72), T(512x80),
    T(512x88), T(512x96), T(512x104), T(512x112), T(512x120), T(512x128), T(576x8), T(576x16), T(576x24), T(576x32),
    T(576x40), T(576x48), T(576x56), T(576x72), T(576x80), T(576x88), T(576x96), T(576x104), T(576x112), T(640x8),
    T(640x16), T(640x24), T(640x32), T(640x40), T(640x48), T(640x56), T(640x72), T(640x80), T(640x88), T(640x96),
    T(704x8), T(704x16), T(704x24), T(704x32), T(704x40), T(704x48), T(704x56), T(704x72), T(704x80), T(704x88),
    T(768x8), T(768x16), T(768x24), T(768x32), T(768x40), T(768x48), T(768x56), T(768x72), T(768x80), T(256x512),
    T(256x1024), T(512x512), T(512x1024),
};
#undef T

#define S(n) {CUBLASLT_MATMUL_STAGES_##n, #n}
constexpr Name kStagesNames[] = {
    S(16x1), S(16x2), S(16x3), S(16x4), S(16x5), S(16x6), S(32x1), S(32x2), S(32x3), S(32x4), S(32x5), S(32x6),
    S(64x1), S(64x2), S(64x3), S(64x4), S(64x5), S(64x6), S(128x1), S(128x2), S(128x3), S(128x4), S(128x5), S(128x6),
    S(32x10), S(8x4), S(16x10), S(8x5), S(8x3), S(8xAUTO), S(16xAUTO), S(32xAUTO), S(64xAUTO), S(128xAUTO),
    S(256xAUTO), S(768xAUTO),
};
#undef S

#define C(n) {CUBLASLT_CLUSTER_SHAPE_##n, #n}
constexpr Name kClusterNames[] = {  // 0 is CUBLASLT_CLUSTER_SHAPE_AUTO
    C(1x1x1), C(2x1x1), C(4x1x1), C(1x2x1), C(2x2x1), C(4x2x1), C(1x4x1), C(2x4x1), C(4x4x1), C(8x1x1), C(1x8x1),
    C(8x2x1), C(2x8x1), C(16x1x1), C(1x16x1), C(3x1x1), C(5x1x1), C(6x1x1), C(7x1x1), C(9x1x1), C(10x1x1), C(11x1x1),
    C(12x1x1), C(13x1x1), C(14x1x1), C(15x1x1), C(3x2x1), C(5x2x1), C(6x2x1), C(7x2x1), C(1x3x1), C(2x3x1), C(3x3x1),
    C(4x3x1), C(5x3x1), C(3x4x1), C(1x5x1), C(2x5x1), C(3x5x1), C(1x6x1), C(2x6x1), C(1x7x1), C(2x7x1), C(1x9x1),
    C(1x10x1), C(1x11x1), C(1x12x1), C(1x13x1), C(1x14x1), C(1x15x1),
};
#undef C
// clang-format on

template <size_t N>
std::string name_of(const Name (&table)[N], int value, const char* undefined) {
  if (value == 0) return undefined;
  for (const Name& entry : table)
    if (entry.value == value) return entry.name;
  return "#" + std::to_string(value);
}

std::string tile_name(uint32_t tile) { return name_of(kTileNames, static_cast<int>(tile), "undefined"); }
std::string stages_name(uint32_t stages) { return name_of(kStagesNames, static_cast<int>(stages), "undefined"); }
std::string cluster_name(uint16_t cluster) { return name_of(kClusterNames, cluster, "auto"); }

std::string reduction_name(uint32_t scheme) {
  switch (scheme) {
    case CUBLASLT_REDUCTION_SCHEME_NONE:
      return "none";
    case CUBLASLT_REDUCTION_SCHEME_INPLACE:
      return "inplace";
    case CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE:
      return "compute";
    case CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE:
      return "output";
    default:
      return "#" + std::to_string(scheme);
  }
}

// ---------------------------------------------------------------------------------------
// Errors: a failing CUDA or cuBLASLt call outside the configs under test ends the run.

void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess)
    throw std::runtime_error("bench_gemm_configs: " + what + ": " + cudaGetErrorString(status));
}

std::string status_name(cublasStatus_t status) { return cublasLtGetStatusName(status); }

void check_cublas(cublasStatus_t status, const std::string& what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("bench_gemm_configs: " + what + " failed: " + status_name(status) + " (" +
                             cublasLtGetStatusString(status) + ")");
}

// ---------------------------------------------------------------------------------------
// One algorithm configuration: the attributes cublasLtMatmulAlgoConfigSetAttribute takes,
// each in the type the header gives it (a size mismatch is CUBLAS_STATUS_INVALID_VALUE).

struct Config {
  int32_t algo = 0;
  uint32_t tile = 0, stages = 0;
  int32_t splitk = 1;
  uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE, swizzle = 0, custom = 0;
  uint16_t cluster = CUBLASLT_CLUSTER_SHAPE_AUTO, inner = 0;
  auto operator<=>(const Config&) const = default;

  std::string describe() const {
    std::string text = "algo=" + std::to_string(algo) + " tile=" + tile_name(tile) + " stages=" + stages_name(stages) +
                       " splitk=" + std::to_string(splitk) + " red=" + reduction_name(reduction) +
                       " swizzle=" + std::to_string(swizzle) + " cluster=" + cluster_name(cluster) +
                       " custom=" + std::to_string(custom);
    if (inner) text += " inner=" + std::to_string(inner);  // the heuristic may set it; the sweep never does
    return text;
  }
};

template <class V>
V get_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute, const char* name) {
  V value{};
  size_t written = 0;
  check_cublas(cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, sizeof value, &written),
               std::string("cublasLtMatmulAlgoConfigGetAttribute(") + name + ")");
  return value;
}

template <class V>
void set_config(cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute, V value, const char* name) {
  check_cublas(cublasLtMatmulAlgoConfigSetAttribute(&algo, attribute, &value, sizeof value),
               std::string("cublasLtMatmulAlgoConfigSetAttribute(") + name + ")");
}

Config read_config(const cublasLtMatmulAlgo_t& algo) {
  Config c;
  c.algo = get_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID, "ID");
  c.tile = get_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, "TILE_ID");
  c.stages = get_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, "STAGES_ID");
  c.splitk = get_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, "SPLITK_NUM");
  c.reduction = get_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, "REDUCTION_SCHEME");
  c.swizzle = get_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, "CTA_SWIZZLING");
  c.custom = get_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, "CUSTOM_OPTION");
  c.cluster = get_config<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, "CLUSTER_SHAPE_ID");
  c.inner = get_config<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, "INNER_SHAPE_ID");
  return c;
}

// What a fixed rule would do: initialise the algorithm id, then set every attribute.
void apply_config(cublasLtMatmulAlgo_t& algo, const Config& c) {
  set_config(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, c.tile, "TILE_ID");
  set_config(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, c.stages, "STAGES_ID");
  set_config(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, c.splitk, "SPLITK_NUM");
  set_config(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, c.reduction, "REDUCTION_SCHEME");
  set_config(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, c.swizzle, "CTA_SWIZZLING");
  set_config(algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, c.custom, "CUSTOM_OPTION");
  set_config(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, c.cluster, "CLUSTER_SHAPE_ID");
  set_config(algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, c.inner, "INNER_SHAPE_ID");
}

// The BF16 in, BF16 out, FP32 compute and scale types of matmul_forward's BF16 GEMMs.
cublasStatus_t init_algo(cublasLtHandle_t handle, int32_t id, cublasLtMatmulAlgo_t* algo) {
  return cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF,
                                CUDA_R_16BF, id, algo);
}

// What an algorithm id supports (cublasLtMatmulAlgoCapGetAttribute).
struct Caps {
  std::vector<uint32_t> tiles, stages;  // {UNDEFINED} when the algorithm lists none
  bool splitk = false, swizzle = false;
  uint32_t reductions = 0;
  int32_t custom_max = 0;
};

template <class V>
V get_cap(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attribute, const char* name) {
  V value{};
  size_t written = 0;
  check_cublas(cublasLtMatmulAlgoCapGetAttribute(&algo, attribute, &value, sizeof value, &written),
               std::string("cublasLtMatmulAlgoCapGetAttribute(") + name + ")");
  return value;
}

// The tile and stages lists: size first (sizeInBytes 0 gives the bytes needed), then values.
std::vector<uint32_t> get_cap_list(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attribute,
                                   const char* name) {
  const std::string what = std::string("cublasLtMatmulAlgoCapGetAttribute(") + name + ")";
  size_t bytes = 0;
  check_cublas(cublasLtMatmulAlgoCapGetAttribute(&algo, attribute, nullptr, 0, &bytes), what);
  std::vector<uint32_t> values(bytes / sizeof(uint32_t));
  if (!values.empty())
    check_cublas(cublasLtMatmulAlgoCapGetAttribute(&algo, attribute, values.data(), bytes, &bytes), what);
  if (values.empty()) values.push_back(0);  // the header: "if no ids are supported use ..._UNDEFINED"
  return values;
}

Caps read_caps(const cublasLtMatmulAlgo_t& algo) {
  Caps caps;
  caps.tiles = get_cap_list(algo, CUBLASLT_ALGO_CAP_TILE_IDS, "TILE_IDS");
  caps.stages = get_cap_list(algo, CUBLASLT_ALGO_CAP_STAGES_IDS, "STAGES_IDS");
  caps.splitk = get_cap<int32_t>(algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, "SPLITK_SUPPORT") != 0;
  caps.reductions = get_cap<uint32_t>(algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, "REDUCTION_SCHEME_MASK");
  caps.swizzle = get_cap<uint32_t>(algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, "CTA_SWIZZLING_SUPPORT") != 0;
  caps.custom_max = get_cap<int32_t>(algo, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, "CUSTOM_OPTION_MAX");
  return caps;
}

// ---------------------------------------------------------------------------------------
// Buffers and one GEMM's descriptors.

struct DeviceBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t size) : bytes(size) { check_cuda(cudaMalloc(&data, bytes), "cudaMalloc"); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data); }

  // One host copy of the random pattern, then device-to-device copies of it across the buffer.
  void fill(const std::vector<uint16_t>& pattern) {
    const size_t chunk = std::min(bytes, pattern.size() * sizeof(uint16_t));
    check_cuda(cudaMemcpy(data, pattern.data(), chunk, cudaMemcpyHostToDevice), "fill");
    for (size_t offset = chunk; offset < bytes; offset += chunk)
      check_cuda(cudaMemcpy(static_cast<char*>(data) + offset, data, std::min(chunk, bytes - offset),
                            cudaMemcpyDeviceToDevice),
                 "fill");
  }
};

struct Shape {
  const char* name;
  int64_t in, out;  // I, O
};

// The descriptors of one GEMM as kernels/matmul.cu's Plan::build makes them for
// matmul_forward: outᵀ [O,N] = (W as col-major [I,O])ᵀ · (x as col-major [I,N]).
struct Gemm {
  Shape shape;
  int64_t tokens = 0;
  uint64_t m = 0, n = 0, k = 0;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;

  Gemm(const Shape& s, int64_t n_tokens) : shape(s), tokens(n_tokens) {
    m = static_cast<uint64_t>(s.out), n = static_cast<uint64_t>(n_tokens), k = static_cast<uint64_t>(s.in);
    check_cublas(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a),
                 "cublasLtMatmulDescSetAttribute(TRANSA)");
    check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b),
                 "cublasLtMatmulDescSetAttribute(TRANSB)");
    const auto layout = [](cublasLtMatrixLayout_t* made, uint64_t rows, uint64_t cols) {
      check_cublas(cublasLtMatrixLayoutCreate(made, CUDA_R_16BF, rows, cols, static_cast<int64_t>(rows)),
                   "cublasLtMatrixLayoutCreate");
    };
    layout(&a, k, m);  // A stored [k,m], used transposed
    layout(&b, k, n);
    layout(&c, m, n);
  }
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  ~Gemm() {
    for (cublasLtMatrixLayout_t layout : {a, b, c})
      if (layout) cublasLtMatrixLayoutDestroy(layout);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }

  std::string label() const { return std::string(shape.name) + " M=" + std::to_string(tokens); }
};

// The heuristic as matmul.cu asks it: 32 MiB of workspace, 16-byte alignments.
std::vector<cublasLtMatmulHeuristicResult_t> heuristic(cublasLtHandle_t handle, const Gemm& gemm, int count) {
  cublasLtMatmulPreference_t preference = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  const auto set = [&](cublasLtMatmulPreferenceAttributes_t attribute, auto value, const char* name) {
    const cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof value);
    if (status != CUBLAS_STATUS_SUCCESS) cublasLtMatmulPreferenceDestroy(preference);
    check_cublas(status, std::string("cublasLtMatmulPreferenceSetAttribute(") + name + ")");
  };
  set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes), "MAX_WORKSPACE_BYTES");
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, kAlignment, "MIN_ALIGNMENT_A_BYTES");
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, kAlignment, "MIN_ALIGNMENT_B_BYTES");
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, kAlignment, "MIN_ALIGNMENT_C_BYTES");
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, kAlignment, "MIN_ALIGNMENT_D_BYTES");
  std::vector<cublasLtMatmulHeuristicResult_t> results(count);
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, gemm.desc, gemm.a, gemm.b, gemm.c, gemm.c,
                                                               preference, count, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(preference);
  check_cublas(status, "cublasLtMatmulAlgoGetHeuristic for " + gemm.label());
  results.resize(found);
  std::erase_if(results, [](const auto& r) { return r.state != CUBLAS_STATUS_SUCCESS; });
  if (results.empty())
    throw std::runtime_error("bench_gemm_configs: the heuristic has no algorithm for " + gemm.label());
  return results;
}

// ---------------------------------------------------------------------------------------
// Measuring one config.

struct Options {
  std::vector<int64_t> tokens = {64, 256};
  int max_configs = 400, refine = 200, calls = 50, launches = 5, top = 5;
  std::string csv;
};

struct Checked {  // a config cublasLtMatmulAlgoCheck accepts
  cublasLtMatmulAlgo_t algo{};
  Config config;
  size_t workspace = 0;
  float waves = 0;
};

struct Measured {
  Checked checked;
  std::string source;  // pick, rebuilt, h#i (the heuristic's i-th), sweep, refine
  double us = 0, error = 0;
  bool wrong = false, reproducible = false, same_bits = false;
};

// Everything one GEMM's measurements share.
struct Bench {
  const Options& options;
  cublasLtHandle_t handle;
  cudaStream_t stream;
  const Gemm& gemm;
  DeviceBuffer& weights;  // `copies` copies of W, back to back
  int copies;
  DeviceBuffer& x;
  DeviceBuffer& out;
  DeviceBuffer& workspace;
  std::vector<uint16_t> reference{};  // the pick's output
  float reference_max = 0;
  std::map<std::string, int> skipped{};  // why configs did not run, counted
  std::set<Config> seen{};               // timed already
  int checks = 0;                        // cublasLtMatmulAlgoCheck calls

  const void* weight(int call) const {
    const size_t bytes = gemm.m * gemm.k * sizeof(uint16_t);
    return static_cast<const char*>(weights.data) + static_cast<size_t>(call % copies) * bytes;
  }

  cublasStatus_t matmul(const cublasLtMatmulAlgo_t& algo, int call) {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(handle, gemm.desc, &alpha, weight(call), gemm.a, x.data, gemm.b, &beta, out.data, gemm.c,
                          out.data, gemm.c, &algo, workspace.data, workspace.bytes, stream);
  }

  // Check a config; nullopt (counted) when cuBLASLt rejects it or it wants too much workspace.
  std::optional<Checked> check(const cublasLtMatmulAlgo_t& algo) {
    cublasLtMatmulHeuristicResult_t result{};
    ++checks;
    const cublasStatus_t status =
        cublasLtMatmulAlgoCheck(handle, gemm.desc, gemm.a, gemm.b, gemm.c, gemm.c, &algo, &result);
    if (status != CUBLAS_STATUS_SUCCESS) {
      ++skipped["check " + status_name(status)];
      return std::nullopt;
    }
    if (result.workspaceSize > kWorkspaceBytes) {
      ++skipped["workspace > 32 MiB"];
      return std::nullopt;
    }
    return Checked{algo, read_config(algo), result.workspaceSize, result.wavesCount};
  }

  // Runs the GEMM once on W copy 0 into an output filled with NaN; false (counted) when
  // cublasLtMatmul refuses the config. A failure that breaks the CUDA context ends the run.
  bool run_once(const Checked& c, std::vector<uint16_t>& host) {
    check_cuda(cudaMemsetAsync(out.data, 0xff, out.bytes, stream), "cudaMemsetAsync");  // 0xffff: a BF16 NaN
    const cublasStatus_t status = matmul(c.algo, 0);
    if (status != CUBLAS_STATUS_SUCCESS) {
      cudaGetLastError();  // a refused launch is not sticky; clear it, then make sure
      check_cuda(cudaStreamSynchronize(stream), "the GEMM stream after " + c.config.describe() + " failed");
      ++skipped["matmul " + status_name(status)];
      return false;
    }
    host.resize(out.bytes / sizeof(uint16_t));
    check_cuda(cudaMemcpyAsync(host.data(), out.data, out.bytes, cudaMemcpyDeviceToHost, stream), "copy of out");
    check_cuda(cudaStreamSynchronize(stream), "GEMM " + c.config.describe());
    return true;
  }

  // us per call of `call(i)`, captured `calls` times in one graph; median of the launches.
  std::optional<double> time_graph(const std::function<cublasStatus_t(int)>& call) {
    cudaGraph_t graph = nullptr;
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < options.calls && status == CUBLAS_STATUS_SUCCESS; ++i) status = call(i);
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (status != CUBLAS_STATUS_SUCCESS) {
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      ++skipped["matmul in capture " + status_name(status)];
      return std::nullopt;
    }
    check_cuda(ended, "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph);
    check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch (warm-up)");
    std::vector<cudaEvent_t> events(2 * options.launches);
    for (cudaEvent_t& event : events) check_cuda(cudaEventCreate(&event), "cudaEventCreate");
    for (int i = 0; i < options.launches; ++i) {
      check_cuda(cudaEventRecord(events[2 * i], stream), "cudaEventRecord");
      check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      check_cuda(cudaEventRecord(events[2 * i + 1], stream), "cudaEventRecord");
    }
    check_cuda(cudaStreamSynchronize(stream), "the timed graph");
    std::vector<float> ms(options.launches);
    for (int i = 0; i < options.launches; ++i)
      check_cuda(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]), "cudaEventElapsedTime");
    for (cudaEvent_t event : events) cudaEventDestroy(event);
    cudaGraphExecDestroy(exec);
    std::nth_element(ms.begin(), ms.begin() + options.launches / 2, ms.end());
    return 1e3 * ms[options.launches / 2] / options.calls;
  }

  // max |got - reference| / max |reference|; infinite when got holds a NaN.
  double error(const std::vector<uint16_t>& got) const {
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float value = bf16_to_float(got[i]);
      if (std::isnan(value)) return INFINITY;
      worst = std::max(worst, static_cast<double>(std::fabs(value - bf16_to_float(reference[i]))));
    }
    return worst / reference_max;
  }

  // Correctness, reproducibility and time of one checked config; the first one measured (the
  // pick) becomes the reference. nullopt when it does not run (counted in `skipped`).
  std::optional<Measured> measure(const Checked& c, std::string source) {
    std::vector<std::vector<uint16_t>> runs(kRuns);
    for (auto& run : runs)
      if (!run_once(c, run)) return std::nullopt;
    if (reference.empty()) {
      reference = runs[0];
      for (uint16_t value : reference) reference_max = std::max(reference_max, std::fabs(bf16_to_float(value)));
      if (!(reference_max > 0)) throw std::runtime_error("bench_gemm_configs: the pick's output is zero or NaN");
    }
    Measured m{c, std::move(source)};
    m.error = error(runs[0]);
    m.wrong = !(m.error <= kTolerance);
    m.reproducible = std::all_of(runs.begin() + 1, runs.end(), [&](const auto& run) { return run == runs[0]; });
    m.same_bits = runs[0] == reference;
    const std::optional<double> us = time_graph([&](int i) { return matmul(c.algo, i); });
    if (!us) return std::nullopt;
    m.us = *us;
    seen.insert(c.config);
    return m;
  }
};

// ---------------------------------------------------------------------------------------
// The sweep's candidates.

// Stage ids are "<size>x<count>" or "<size>xAUTO". Prefer an AUTO id (the library sizes the
// pipeline); else the deepest pipeline, as a memory-bound GEMM wants the most bytes in flight.
int stage_preference(uint32_t stages) {
  const std::string name = stages_name(stages);
  const size_t x = name.find('x');
  if (x == std::string::npos) return 0;
  if (name.substr(x + 1) == "AUTO") return 1 << 30;
  return std::atoi(name.c_str()) * std::atoi(name.c_str() + x + 1);
}

// Every (algorithm id, tile) pair that runs this GEMM unsplit, with its split-K variants,
// ordered so that a cap on their number keeps the most promising of every tile: the unsplit
// config of each tile first, then each tile's second-best guess, and so on. Within a tile the
// split counts whose grid comes nearest one full wave (cublasLtMatmulAlgoCheck's wavesCount)
// go first; tiles that fill the GPU unsplit get their splits last.
std::vector<Checked> sweep_candidates(Bench& bench, const std::vector<int>& ids, int& pairs) {
  struct Ranked {
    int rank;
    Checked checked;
  };
  std::vector<Ranked> ranked;
  pairs = 0;
  for (int id : ids) {
    cublasLtMatmulAlgo_t algo{};
    const cublasStatus_t status = init_algo(bench.handle, id, &algo);
    if (status != CUBLAS_STATUS_SUCCESS) {
      ++bench.skipped["init " + status_name(status)];
      continue;
    }
    const Caps caps = read_caps(algo);
    std::vector<uint32_t> stages = caps.stages;
    std::stable_sort(stages.begin(), stages.end(),
                     [](uint32_t p, uint32_t q) { return stage_preference(p) > stage_preference(q); });
    for (uint32_t tile : caps.tiles) {
      // The unsplit config at the preferred stage count that passes the check, with the
      // automatic cluster shape, or 1x1x1 where the algorithm wants a definite one.
      std::optional<Checked> base;
      for (uint16_t cluster : {uint16_t{CUBLASLT_CLUSTER_SHAPE_AUTO}, uint16_t{CUBLASLT_CLUSTER_SHAPE_1x1x1}}) {
        for (uint32_t stage : stages) {
          Config config;
          config.algo = id, config.tile = tile, config.stages = stage, config.cluster = cluster;
          apply_config(algo, config);
          if ((base = bench.check(algo))) break;
        }
        if (base) break;
      }
      if (!base) continue;
      ++pairs;
      ranked.push_back({0, *base});
      if (!caps.splitk) continue;
      std::vector<Checked> splits;
      for (int splitk : kSplits)
        for (uint32_t reduction : kReductions) {
          if (!(caps.reductions & reduction)) continue;
          Config config = base->config;
          config.splitk = splitk, config.reduction = reduction;
          cublasLtMatmulAlgo_t split = base->algo;
          apply_config(split, config);
          if (auto checked = bench.check(split)) splits.push_back(*checked);
        }
      const auto distance = [](const Checked& c) { return c.waves > 0 ? std::fabs(std::log(c.waves)) : 1e9; };
      std::stable_sort(splits.begin(), splits.end(),
                       [&](const Checked& p, const Checked& q) { return distance(p) < distance(q); });
      const int penalty = base->waves >= 1.0f ? 1000 : 0;
      for (size_t i = 0; i < splits.size(); ++i) ranked.push_back({penalty + 1 + static_cast<int>(i), splits[i]});
    }
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Ranked& p, const Ranked& q) { return p.rank < q.rank; });
  std::vector<Checked> candidates;
  for (const Ranked& r : ranked) candidates.push_back(r.checked);
  return candidates;
}

// The configs one attribute away from `seed`: other cluster shapes, stage counts, swizzling,
// custom options, split counts and reduction schemes.
std::vector<Checked> neighbours(Bench& bench, const Checked& seed) {
  const Config& s = seed.config;
  cublasLtMatmulAlgo_t algo{};
  check_cublas(init_algo(bench.handle, s.algo, &algo), "cublasLtMatmulAlgoInit(" + std::to_string(s.algo) + ")");
  const Caps caps = read_caps(algo);
  std::vector<Config> configs;
  for (uint16_t cluster : kClusters) configs.push_back(s), configs.back().cluster = cluster;
  for (uint32_t stages : caps.stages) configs.push_back(s), configs.back().stages = stages;
  if (caps.swizzle) configs.push_back(s), configs.back().swizzle = 1 - s.swizzle;
  for (int32_t custom = 0; custom <= std::min(caps.custom_max, 7); ++custom)
    configs.push_back(s), configs.back().custom = static_cast<uint32_t>(custom);
  if (caps.splitk) {
    configs.push_back(s), configs.back().splitk = 1, configs.back().reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    for (int splitk : kSplits)
      for (uint32_t reduction : kReductions)
        if (caps.reductions & reduction)
          configs.push_back(s), configs.back().splitk = splitk, configs.back().reduction = reduction;
  }
  std::vector<Checked> result;
  std::set<Config> listed;
  for (const Config& config : configs) {
    if (bench.seen.count(config) || !listed.insert(config).second) continue;
    cublasLtMatmulAlgo_t variant = algo;
    apply_config(variant, config);
    if (auto checked = bench.check(variant)) result.push_back(*checked);
  }
  return result;
}

// ---------------------------------------------------------------------------------------
// Reporting.

std::string speedup(double pick, double us) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2fx", pick / us);
  return text;
}

std::string row(const Measured& m) {
  char text[96];
  std::snprintf(text, sizeof text, "%6.2fus ws=%.1fM waves=%.2f repro=%s same=%s err=%.0e", m.us,
                m.checked.workspace / 1048576.0, m.checked.waves, m.reproducible ? "y" : "n", m.same_bits ? "y" : "n",
                m.error);
  return text;
}

std::string shape_line(const char* tag, const Gemm& gemm, double pick, const Measured& best) {
  char head[160];
  std::snprintf(head, sizeof head, "%s %s M=%lld pick %.2f us best %.2f us (%s) ", tag, gemm.shape.name,
                static_cast<long long>(gemm.tokens), pick, best.us, speedup(pick, best.us).c_str());
  return head + best.checked.config.describe() + " reproducible=" + (best.reproducible ? "yes" : "no") +
         " source=" + best.source;
}

void write_csv(std::FILE* csv, const Gemm& gemm, double pick, const Measured& m) {
  const Config& c = m.checked.config;
  std::fprintf(csv, "%s,%lld,%s,%.3f,%.4f,%.3e,%d,%d,%d,%zu,%.3f,%d,%s,%s,%d,%s,%u,%s,%u,%u\n", gemm.shape.name,
               static_cast<long long>(gemm.tokens), m.source.c_str(), m.us, pick / m.us, m.error, m.wrong,
               m.reproducible, m.same_bits, m.checked.workspace, m.checked.waves, c.algo, tile_name(c.tile).c_str(),
               stages_name(c.stages).c_str(), c.splitk, reduction_name(c.reduction).c_str(), c.swizzle,
               cluster_name(c.cluster).c_str(), c.custom, c.inner);
}

// ---------------------------------------------------------------------------------------

// All of one GEMM: returns its summary lines.
std::vector<std::string> run_gemm(const Options& options, cublasLtHandle_t handle, cudaStream_t stream,
                                  const Shape& shape, int64_t tokens, const std::vector<uint16_t>& pattern,
                                  const std::vector<int>& ids, DeviceBuffer& workspace, std::FILE* csv) {
  const auto started = std::chrono::steady_clock::now();
  const Gemm gemm(shape, tokens);
  const size_t weight_bytes = gemm.m * gemm.k * sizeof(uint16_t);
  const int copies = static_cast<int>(std::max<size_t>(2, (kRotationBytes + weight_bytes - 1) / weight_bytes));
  DeviceBuffer weights(weight_bytes * copies), x(gemm.k * gemm.n * sizeof(uint16_t)),
      out(gemm.m * gemm.n * sizeof(uint16_t));
  weights.fill(pattern);
  x.fill(pattern);
  Bench bench{options, handle, stream, gemm, weights, copies, x, out, workspace};
  std::printf("== %s: m=%llu n=%llu k=%llu, %d copies of W (%.0f MiB) ==\n", gemm.label().c_str(),
              static_cast<unsigned long long>(gemm.m), static_cast<unsigned long long>(gemm.n),
              static_cast<unsigned long long>(gemm.k), copies, weight_bytes * copies / 1048576.0);

  std::vector<Measured> all;
  const auto keep = [&](std::optional<Measured> m) {
    if (!m) return;
    if (csv) write_csv(csv, gemm, all.empty() ? m->us : all[0].us, *m);
    all.push_back(std::move(*m));
  };

  // (a) the pick, exactly as matmul.cu takes it: the heuristic asked for one algorithm. Its
  // graph runs a few times untimed first, so that the clocks are up for the figure all others
  // are compared with (it is timed again at the end to show the drift).
  const cublasLtMatmulHeuristicResult_t first = heuristic(handle, gemm, 1)[0];
  const Checked pick{first.algo, read_config(first.algo), first.workspaceSize, first.wavesCount};
  const auto time_pick = [&] { return bench.time_graph([&](int i) { return bench.matmul(pick.algo, i); }); };
  for (int i = 0; i < 4; ++i) time_pick();
  std::optional<Measured> measured_pick = bench.measure(pick, "pick");
  if (!measured_pick)
    throw std::runtime_error("bench_gemm_configs: the heuristic's pick did not run for " + gemm.label());
  keep(measured_pick);
  const double pick_us = all[0].us;
  std::printf("pick           %s %s\n", row(all[0]).c_str(), pick.config.describe().c_str());

  // matmul_forward itself, through its own context: the same bits and time show the replica is exact.
  {
    cuda::MatmulContext context = cuda::make_matmul_context(stream);
    const auto view = [](const DeviceBuffer& buffer, int64_t offset, std::vector<int64_t> dims) {
      return Tensor::view(static_cast<char*>(buffer.data) + offset, DType::BF16, Device::CUDA, std::move(dims));
    };
    const Tensor x_t = view(x, 0, {gemm.tokens, shape.in}), out_t = view(out, 0, {gemm.tokens, shape.out}), none;
    const auto forward = [&](int call) {
      const Tensor w_t = view(weights, static_cast<int64_t>((call % copies) * weight_bytes), {shape.out, shape.in});
      cuda::matmul_forward(context, out_t, x_t, w_t, none);
      return CUBLAS_STATUS_SUCCESS;
    };
    check_cuda(cudaMemsetAsync(out.data, 0xff, out.bytes, stream), "cudaMemsetAsync");
    forward(0);  // builds the plan outside the capture
    std::vector<uint16_t> host(out.bytes / sizeof(uint16_t));
    check_cuda(cudaMemcpyAsync(host.data(), out.data, out.bytes, cudaMemcpyDeviceToHost, stream), "copy of out");
    check_cuda(cudaStreamSynchronize(stream), "matmul_forward");
    const std::optional<double> us = bench.time_graph(forward);
    std::printf("matmul_forward %6.2f us same bits as the pick: %s\n", us ? *us : NAN,
                host == bench.reference ? "yes" : "NO");
    cuda::destroy_matmul_context(context);
  }

  // The pick rebuilt from its attributes: what a fixed rule would run.
  {
    cublasLtMatmulAlgo_t rebuilt{};
    check_cublas(init_algo(handle, pick.config.algo, &rebuilt), "cublasLtMatmulAlgoInit of the pick's id");
    apply_config(rebuilt, pick.config);
    const bool same_struct = std::memcmp(&rebuilt, &pick.algo, sizeof rebuilt) == 0;
    std::optional<Checked> checked = bench.check(rebuilt);
    std::optional<Measured> m = checked ? bench.measure(*checked, "rebuilt") : std::nullopt;
    if (m)
      std::printf("rebuilt pick   %s algo struct identical: %s\n", row(*m).c_str(), same_struct ? "yes" : "no");
    else
      std::printf("rebuilt pick   does not run (algo struct identical: %s)\n", same_struct ? "yes" : "no");
    keep(std::move(m));
  }

  // (b) every candidate of the heuristic.
  const std::vector<cublasLtMatmulHeuristicResult_t> candidates = heuristic(handle, gemm, kMaxHeuristic);
  const size_t heuristic_begin = all.size();
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Checked c{candidates[i].algo, read_config(candidates[i].algo), candidates[i].workspaceSize,
                    candidates[i].wavesCount};
    keep(bench.measure(c, "h#" + std::to_string(i)));
  }
  if (all.size() > heuristic_begin) {
    const auto fastest = std::min_element(all.begin() + heuristic_begin, all.end(),
                                          [](const Measured& p, const Measured& q) { return p.us < q.us; });
    std::printf("heuristic      %zu candidates, fastest %s %.2f us (%s vs pick)%s\n", candidates.size(),
                fastest->source.c_str(), fastest->us, speedup(pick_us, fastest->us).c_str(),
                fastest->wrong ? " WRONG" : "");
  }

  // (c) the sweep, then the refine phase around the fastest correct configs so far.
  int pairs = 0;
  const auto enumerate_start = std::chrono::steady_clock::now();
  const std::vector<Checked> sweep = sweep_candidates(bench, ids, pairs);
  const double enumerate_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - enumerate_start).count();
  int swept = 0, refined = 0;
  for (const Checked& c : sweep) {
    if (swept >= options.max_configs) break;
    if (bench.seen.count(c.config)) continue;
    ++swept;
    keep(bench.measure(c, "sweep"));
  }
  // The correct configs, fastest first, each config once (its fastest timing). The pointers
  // into `all` are used before `all` grows again.
  const auto ranked = [&] {
    std::vector<const Measured*> order;
    for (const Measured& m : all)
      if (!m.wrong) order.push_back(&m);
    std::stable_sort(order.begin(), order.end(), [](const Measured* p, const Measured* q) { return p->us < q->us; });
    std::set<Config> listed;
    std::erase_if(order, [&](const Measured* m) { return !listed.insert(m->checked.config).second; });
    return order;
  };
  std::vector<Checked> seeds;
  for (const Measured* m : ranked())
    if (static_cast<int>(seeds.size()) < kSeeds) seeds.push_back(m->checked);
  for (const Checked& seed : seeds) {
    if (refined >= options.refine) break;
    for (const Checked& c : neighbours(bench, seed)) {
      if (refined >= options.refine) break;
      if (bench.seen.count(c.config)) continue;
      ++refined;
      keep(bench.measure(c, "refine"));
    }
  }
  const std::optional<double> pick_again = time_pick();
  const std::vector<const Measured*> order = ranked();  // never empty: the pick is its own reference

  int wrong = 0;
  const Measured* wrong_example = nullptr;
  for (const Measured& m : all)
    if (m.wrong) ++wrong, wrong_example = wrong_example ? wrong_example : &m;
  std::string skipped;
  for (const auto& [why, count] : bench.skipped)
    if (why.rfind("check ", 0) != 0) skipped += " " + why + ":" + std::to_string(count);
  int rejected = 0;
  for (const auto& [why, count] : bench.skipped)
    if (why.rfind("check ", 0) == 0) rejected += count;
  std::printf(
      "sweep          %zu algo ids, %d (algo,tile) pairs, %zu candidates (%.1f s; %d of %d checks rejected); "
      "timed %d + %d refined; skipped%s; WRONG %d; pick again %.2f us\n",
      ids.size(), pairs, sweep.size(), enumerate_s, rejected, bench.checks, swept, refined,
      skipped.empty() ? " none" : skipped.c_str(), wrong, pick_again ? *pick_again : NAN);
  if (wrong_example)
    std::printf("  e.g. WRONG    err=%.1e %s (%s)\n", wrong_example->error,
                wrong_example->checked.config.describe().c_str(), wrong_example->source.c_str());
  for (int i = 0; i < options.top && i < static_cast<int>(order.size()); ++i)
    std::printf("  %d %s %s %-6s %s\n", i + 1, speedup(pick_us, order[i]->us).c_str(), row(*order[i]).c_str(),
                order[i]->source.c_str(), order[i]->checked.config.describe().c_str());
  std::printf("  (%.1f s)\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());

  std::vector<std::string> summary = {shape_line("shape", gemm, pick_us, *order[0])};
  if (!order[0]->reproducible)
    for (const Measured* m : order)
      if (m->reproducible) {
        summary.push_back(shape_line("shape-repro", gemm, pick_us, *m));
        break;
      }
  for (const std::string& line : summary) std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return summary;
}

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "bench_gemm_configs: %s\nusage: bench_gemm_configs [--tokens 64,256] [--max-configs 400] "
               "[--refine 200] [--calls 50] [--launches 5] [--top 5] [--csv FILE]\n",
               problem.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--csv") {
      options.csv = value;
      continue;
    }
    if (flag == "--tokens") {
      options.tokens.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');) {
        const long tokens = std::atol(item.c_str());
        if (tokens < 1) usage("--tokens wants a comma-separated list of positive integers, got '" + value + "'");
        options.tokens.push_back(tokens);
      }
      if (options.tokens.empty()) usage("--tokens is empty");
      continue;
    }
    const long number = std::atol(value.c_str());
    if (number < 0 || (number == 0 && flag != "--max-configs" && flag != "--refine" && flag != "--top"))
      usage(flag + " must be a positive integer, got '" + value + "'");
    if (flag == "--max-configs")
      options.max_configs = static_cast<int>(number);
    else if (flag == "--refine")
      options.refine = static_cast<int>(number);
    else if (flag == "--calls")
      options.calls = static_cast<int>(number);
    else if (flag == "--launches")
      options.launches = static_cast<int>(number);
    else if (flag == "--top")
      options.top = static_cast<int>(number);
    else
      usage("unknown option '" + flag + "'");
  }
  return options;
}

int run(const Options& options) {
  const auto started = std::chrono::steady_clock::now();
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
  cublasLtHandle_t handle = nullptr;
  check_cublas(cublasLtCreate(&handle), "cublasLtCreate");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  DeviceBuffer workspace(kWorkspaceBytes);

  // Every algorithm id cuBLASLt may run for these types (the ids, not yet their configs).
  std::vector<int> ids(256);
  int found = 0;
  check_cublas(cublasLtMatmulAlgoGetIds(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF,
                                        CUDA_R_16BF, static_cast<int>(ids.size()), ids.data(), &found),
               "cublasLtMatmulAlgoGetIds");
  ids.resize(found);
  std::string id_list;
  for (int id : ids) id_list += " " + std::to_string(id);
  std::printf(
      "bench_gemm_configs on %s (%d SMs, %d MB L2), cuBLASLt %zu: BF16, FP32 accumulation; %d GEMMs a graph, "
      "median of %d launches; algo ids:%s\n",
      properties.name, properties.multiProcessorCount, properties.l2CacheSize >> 20, cublasLtGetVersion(),
      options.calls, options.launches, id_list.c_str());

  std::vector<uint16_t> pattern(size_t{1} << 23);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint16_t& value : pattern) value = float_to_bf16(normal(rng));

  std::FILE* csv = nullptr;
  if (!options.csv.empty()) {
    csv = std::fopen(options.csv.c_str(), "w");
    if (!csv) throw std::runtime_error("bench_gemm_configs: cannot write " + options.csv);
    std::fprintf(csv,
                 "shape,M,source,us,speedup,error,wrong,reproducible,same_bits,workspace,waves,algo,tile,stages,"
                 "splitk,red,swizzle,cluster,custom,inner\n");
  }
  // The Qwen3-0.6B decode GEMMs of one layer (the engine fuses q|k|v and gate|up).
  const Shape shapes[] = {{"qkv", 1024, 4096}, {"o", 2048, 1024}, {"gate_up", 1024, 6144}, {"down", 3072, 1024}};
  std::vector<std::string> summary;
  for (int64_t tokens : options.tokens)
    for (const Shape& shape : shapes)
      for (std::string& line : run_gemm(options, handle, stream, shape, tokens, pattern, ids, workspace, csv))
        summary.push_back(std::move(line));
  if (csv) std::fclose(csv);

  std::printf("== summary (%.0f s) ==\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  for (const std::string& line : summary) std::printf("%s\n", line.c_str());
  cudaStreamDestroy(stream);
  cublasLtDestroy(handle);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

#else

int main() {
  std::fprintf(stderr, "bench_gemm_configs: this build has no CUDA backend\n");
  return 2;
}

#endif  // TANDEM_HAVE_CUDA
