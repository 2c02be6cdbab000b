#include "common/base/host_port.h"

#include <cstdlib>

namespace gradsync {

Status ParseHostPort(const std::string& text, std::string* host, uint16_t* port) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return InvalidArgumentError("'" + text + "' is not HOST:PORT");
  }
  char* end = nullptr;
  long p = std::strtol(text.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p <= 0 || p > 65535) return InvalidArgumentError("'" + text + "' has a bad port");
  *host = text.substr(0, colon);
  *port = static_cast<uint16_t>(p);
  return OkStatus();
}

}  // namespace gradsync
