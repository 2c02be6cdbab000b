#include "experiments/spec/link.h"

#include <algorithm>
#include <regex>

namespace gradsync {

double TbfBurstBytes(double bits_per_s) { return std::max(70000.0, bits_per_s / 8 * 0.004); }

Result<double> TcRateBitsPerSecond(const std::string& rate) {
  static const std::regex kRate("([0-9]+(\\.[0-9]+)?)(bit|kbit|mbit|gbit)");
  std::smatch m;
  // Bounded before the regex: libstdc++'s matcher recurses once per character and overflows the
  // stack on a long enough string (found by fuzz/fuzz_spec).
  if (rate.size() > 64 || !std::regex_match(rate, m, kRate)) {
    return InvalidArgumentError("'" + rate + "' is not a tc rate like 25gbit, 100mbit or 500kbit");
  }
  const double unit = m[3] == "gbit" ? 1e9 : m[3] == "mbit" ? 1e6 : m[3] == "kbit" ? 1e3 : 1;
  const double bits = std::stod(m[1]) * unit;
  if (!(bits > 0)) return InvalidArgumentError("'" + rate + "': a link needs a rate above 0");
  return bits;
}

bool IsCongestionControlName(const std::string& name) {
  if (name.empty() || name.size() > 15) return false;  // TCP_CA_NAME_MAX is 16 with the NUL
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

}  // namespace gradsync
