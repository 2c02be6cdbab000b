// "host:port" text: the address of a scheduler, a peer or a listener as flags and specs write it.
#pragma once

#include <cstdint>
#include <string>

#include "common/base/status.h"

namespace gradsync {

// "host:port" -> its parts; rejects a missing or bad port (not 1-65535).
Status ParseHostPort(const std::string& text, std::string* host, uint16_t* port);

}  // namespace gradsync
