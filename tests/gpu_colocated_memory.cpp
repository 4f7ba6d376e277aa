// The colocated memory scenarios on the CUDA pool (colocated_memory_scenarios.h): pinned
// host buffers reused across sides, the copy transport reading offloaded master weights
// over the bus.
#ifdef TANDEM_HAVE_CUDA
#include "colocated_memory_scenarios.h"
#include "gpu_support.h"

using namespace tandem;

TEST(ColocatedMemoryGpu, EveryModeLevelAndTransportKeepsItsPromise) {
  REQUIRE_GPU();
  tandem::testing::expect_every_mode_level_and_transport_keeps_its_promise(Device::CUDA);
}
#endif
