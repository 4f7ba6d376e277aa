// The background checkpoint writer from a GPU: the snapshot copies the device's slabs
// into pinned memory, and the file is the synchronous writer's byte for byte.
#include "checkpoint_writer_scenarios.h"
#include "gpu_support.h"

using namespace tandem;

TEST(GpuCheckpointWriter, ABackgroundCheckpointIsTheSynchronousOneByteForByte) {
  REQUIRE_GPU();
  tandem::testing::expect_background_checkpoints_match_synchronous_ones(Device::CUDA);
}
