#include "fusedattn/overrides.h"

#include <cstdlib>
#include <string>
#include <string_view>

#include "fusedattn/cat.h"

namespace fusedattn {
namespace {

template <typename E>
struct Choice {
  std::string_view name;
  E value;
};

Status bad_value(const char* var, std::string_view got, std::string_view accepted) {
  return Status::Invalid(cat("environment variable ", var, "=", got, " is not valid; accepted values: ", accepted,
                             " (unset or empty: the default)"));
}

// One of a fixed set of names.
template <typename E, size_t N>
Status parse_choice(EnvLookup lookup, const char* var, const Choice<E> (&table)[N], E* out) {
  const char* raw = lookup(var);
  if (raw == nullptr || *raw == '\0') return Status::Ok();
  for (const auto& c : table) {
    if (c.name == raw) {
      *out = c.value;
      return Status::Ok();
    }
  }
  std::string accepted;
  for (size_t i = 0; i < N; ++i) accepted += cat(i ? ", " : "", table[i].name);
  return bad_value(var, raw, accepted);
}

// "auto" (the default, stored as 0) or a decimal integer in [0, hi].
Status parse_count(EnvLookup lookup, const char* var, int hi, int* out) {
  const char* raw = lookup(var);
  if (raw == nullptr || *raw == '\0') return Status::Ok();
  const std::string_view s(raw);
  if (s == "auto") {
    *out = 0;
    return Status::Ok();
  }
  int64_t v = 0;
  bool ok = !s.empty() && s.size() <= 10;
  for (char c : s) {
    ok = ok && c >= '0' && c <= '9';
    if (ok) v = v * 10 + (c - '0');
  }
  if (!ok || v > hi) return bad_value(var, s, cat("auto or an integer 0-", hi, " (0 = auto)"));
  *out = static_cast<int>(v);
  return Status::Ok();
}

constexpr Choice<CudaEngineChoice> kEngines[] = {
    {"auto", CudaEngineChoice::kAuto}, {"simt", CudaEngineChoice::kSimt}, {"sm80", CudaEngineChoice::kSm80}};
constexpr Choice<HopperFwdChoice> kHopperFwd[] = {
    {"auto", HopperFwdChoice::kAuto},
    {"v2", HopperFwdChoice::kV2},
    {"persistent", HopperFwdChoice::kPersistent},
    {"three_consumer", HopperFwdChoice::kThreeConsumer},
    {"three_consumer_persistent", HopperFwdChoice::kThreeConsumerPersistent}};
constexpr Choice<bool> kOnOff[] = {{"on", true}, {"off", false}, {"1", true}, {"0", false}};
constexpr Choice<int> kPdl[] = {{"2", 2}, {"1", 1}, {"0", 0}};

const char* system_lookup(const char* name) { return std::getenv(name); }

}  // namespace

Status parse_overrides(EnvLookup lookup, Overrides* out) {
  Overrides o;
  FUSEDATTN_RETURN_IF_ERROR(parse_choice(lookup, "FUSEDATTN_CUDA_ENGINE", kEngines, &o.cuda_engine));
  FUSEDATTN_RETURN_IF_ERROR(parse_choice(lookup, "FUSEDATTN_HOPPER_FWD", kHopperFwd, &o.hopper_fwd));
  FUSEDATTN_RETURN_IF_ERROR(parse_choice(lookup, "FUSEDATTN_HOPPER_BWD", kOnOff, &o.hopper_bwd));
  FUSEDATTN_RETURN_IF_ERROR(parse_count(lookup, "FUSEDATTN_HOPPER_CAUSAL_CHUNK", 65535, &o.hopper_causal_chunk));
  FUSEDATTN_RETURN_IF_ERROR(
      parse_count(lookup, "FUSEDATTN_DECODE_SPLITS", Overrides::kMaxDecodeSplits, &o.decode_splits));
  FUSEDATTN_RETURN_IF_ERROR(parse_choice(lookup, "FUSEDATTN_DECODE_PDL", kPdl, &o.decode_pdl));
  *out = o;
  return Status::Ok();
}

const ProcessOverrides& process_overrides() {
  static const ProcessOverrides p = [] {
    ProcessOverrides r;
    r.status = parse_overrides(&system_lookup, &r.values);
    return r;
  }();
  return p;
}

}  // namespace fusedattn
