#include "sync/weight_transport.h"

#include <stdexcept>

namespace tandem {

TransportKind transport_kind_from_name(const std::string& name) {
  if (name == "alias") return TransportKind::Alias;
  if (name == "copy") return TransportKind::Copy;
  if (name == "disk-delta") return TransportKind::DiskDelta;
  if (name == "broadcast") return TransportKind::Broadcast;
  throw std::invalid_argument("unknown weight transport '" + name + "' (alias, copy, disk-delta or broadcast)");
}

const char* transport_kind_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::Alias: return "alias";
    case TransportKind::Copy: return "copy";
    case TransportKind::DiskDelta: return "disk-delta";
    case TransportKind::Broadcast: return "broadcast";
  }
  return "?";
}

}  // namespace tandem
