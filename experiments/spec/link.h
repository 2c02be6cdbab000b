// A spec's link { }: its rate as tc writes it, the tbf bucket that shapes it, and the names a
// congestion control may have. The spec checks a link with these, link emulation
// (experiments/launch/netns.h) sets it up with them, and the simulator models it with them.
#pragma once

#include <string>

#include "common/base/status.h"

namespace gradsync {

// A tc rate ("100mbit", "1gbit", "500kbit", "64bit") in bits per second (tc's units: powers of
// 1000); anything else is kInvalidArgument.
Result<double> TcRateBitsPerSecond(const std::string& rate);

// The tbf bucket of a link of this rate (bytes): at least one full-size GSO packet, and about 4 ms
// of the rate.
double TbfBurstBytes(double bits_per_s);

// Whether `name` can be a TCP congestion control's name (lower-case letters, digits, '_'; at
// most 15 characters), the spec's check before anything is set up.
bool IsCongestionControlName(const std::string& name);

}  // namespace gradsync
