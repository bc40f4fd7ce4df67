// The operator schemas: the one block that declares fusedattn's ops, built from op_spec.h's
// argument lists. Fake implementations and autograd are registered from python/fusedattn/_ops.py.
#include <torch/csrc/stable/library.h>

#include <initializer_list>
#include <string>

#include "op_spec.h"

namespace {

std::string schema(const char* name, std::initializer_list<const char*> args, const char* returns) {
  std::string s = std::string(name) + "(";
  const char* sep = "";
  for (const char* a : args) {
    s += sep;
    s += a;
    sep = ", ";
  }
  return s + ") -> " + returns;
}

}  // namespace

STABLE_TORCH_LIBRARY(fusedattn, m) {
  m.def(schema("fwd", {FUSEDATTN_FWD_ARGS(FUSEDATTN_SCHEMA_ENTRY)}, FUSEDATTN_FWD_RETURNS).c_str());
  m.def(schema("bwd", {FUSEDATTN_BWD_ARGS(FUSEDATTN_SCHEMA_ENTRY)}, FUSEDATTN_BWD_RETURNS).c_str());
  m.def(schema("copy_to_kv_cache", {FUSEDATTN_KV_APPEND_ARGS(FUSEDATTN_SCHEMA_ENTRY)}, FUSEDATTN_KV_APPEND_RETURNS)
            .c_str());
  m.def(schema("fwd_kvcache", {FUSEDATTN_FWD_KVCACHE_ARGS(FUSEDATTN_SCHEMA_ENTRY)}, FUSEDATTN_FWD_KVCACHE_RETURNS)
            .c_str());
}
