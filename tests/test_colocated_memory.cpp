// The colocated memory scenarios on the CPU pool (colocated_memory_scenarios.h).
#include "colocated_memory_scenarios.h"

using namespace tandem;

TEST(ColocatedMemory, EveryModeLevelAndTransportKeepsItsPromise) {
  tandem::testing::expect_every_mode_level_and_transport_keeps_its_promise(Device::CPU);
}

