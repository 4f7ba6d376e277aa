// How a backward op writes an input gradient: `overwrite` for the first (or only) writer
// of a buffer, which then needs no memset before it; `accumulate` (+=) for each further
// branch whose share adds into the same buffer (the residual stream's gradient, the
// d_normed that q, k and v's projections feed together).
#pragma once

namespace tandem {

enum class GradWrite { overwrite, accumulate };

}  // namespace tandem
