#include "sync/weight_transport.h"

#include <stdexcept>

namespace tandem {

TransportKind transport_kind_from_name(const std::string& name) {
  if (name == "alias") return TransportKind::Alias;
  if (name == "copy") return TransportKind::Copy;
  throw std::invalid_argument("unknown weight transport '" + name + "' (alias or copy)");
}

const char* transport_kind_name(TransportKind kind) { return kind == TransportKind::Alias ? "alias" : "copy"; }

}  // namespace tandem
