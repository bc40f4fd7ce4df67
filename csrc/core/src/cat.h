// Internal to the core: builds a Status message from mixed parts.
#pragma once

#include <sstream>
#include <string>

namespace fusedattn {

template <typename... Ts>
std::string cat(const Ts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

}  // namespace fusedattn
