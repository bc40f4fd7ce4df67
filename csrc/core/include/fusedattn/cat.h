// Builds an error or support message from mixed parts (strings, integers,
// floating-point values). Shared by the core and the CUDA engine.
//
// Why no std::ostringstream: number formatting through iostreams goes through
// the locale's facets, whose ids live in libstdc++. A toolchain that links
// libstdc++ statically into the extension (seen on the H200 image, GCC 13 in
// /opt/gcc) leaves two copies in the process, and formatting an integer then
// reads a facet of the other copy and crashes. std::to_chars and snprintf
// touch no locale state.
#pragma once

#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

namespace fusedattn {
namespace cat_detail {

inline void append(std::string& s, std::string_view v) { s.append(v); }
// Without this overload a string literal would convert to bool (a standard
// conversion) rather than to string_view (a user-defined one).
inline void append(std::string& s, const char* v) { s.append(v); }
inline void append(std::string& s, char c) { s.push_back(c); }
inline void append(std::string& s, bool v) { s.append(v ? "true" : "false"); }

template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
void append(std::string& s, T v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  s.append(buf, r.ptr);
}

template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
void append(std::string& s, T v) {
  char buf[32];
  const int n = std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  s.append(buf, n > 0 ? static_cast<size_t>(n) : 0);
}

}  // namespace cat_detail

template <typename... Ts>
std::string cat(const Ts&... parts) {
  std::string s;
  (cat_detail::append(s, parts), ...);
  return s;
}

}  // namespace fusedattn
