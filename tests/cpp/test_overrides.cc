// The FUSEDATTN_* parser (fusedattn/overrides.h) through a fake environment: defaults, every
// accepted value, and a clear error for every malformed one.
#include <map>
#include <string>

#include "attn_test_util.h"
#include "fusedattn/overrides.h"

namespace {

using namespace fusedattn;

std::map<std::string, std::string>& fake_env() {
  static std::map<std::string, std::string> env;
  return env;
}

const char* lookup(const char* name) {
  const auto it = fake_env().find(name);
  return it == fake_env().end() ? nullptr : it->second.c_str();
}

Status parse_with(const std::string& var, const std::string& value, Overrides* out) {
  fake_env().clear();
  fake_env()[var] = value;
  return parse_overrides(&lookup, out);
}

void test_defaults() {
  fake_env().clear();
  Overrides o;
  o.hopper_bwd = false;
  CHECK(parse_overrides(&lookup, &o).ok());
  CHECK(o.cuda_engine == CudaEngineChoice::kAuto && o.hopper_fwd == HopperFwdChoice::kAuto && o.hopper_bwd);
  CHECK(o.hopper_causal_chunk == 0 && o.decode_splits == 0 && o.decode_pdl == 2);
  // An empty value is the default too.
  CHECK(parse_with("FUSEDATTN_HOPPER_BWD", "", &o).ok() && o.hopper_bwd);
}

void test_accepted_values() {
  Overrides o;
  CHECK(parse_with("FUSEDATTN_CUDA_ENGINE", "simt", &o).ok() && o.cuda_engine == CudaEngineChoice::kSimt);
  CHECK(parse_with("FUSEDATTN_CUDA_ENGINE", "sm80", &o).ok() && o.cuda_engine == CudaEngineChoice::kSm80);
  CHECK(parse_with("FUSEDATTN_HOPPER_FWD", "three_consumer_persistent", &o).ok() &&
        o.hopper_fwd == HopperFwdChoice::kThreeConsumerPersistent);
  // "on" means on (atoi("on") == 0 once turned it off).
  CHECK(parse_with("FUSEDATTN_HOPPER_BWD", "on", &o).ok() && o.hopper_bwd);
  CHECK(parse_with("FUSEDATTN_HOPPER_BWD", "1", &o).ok() && o.hopper_bwd);
  CHECK(parse_with("FUSEDATTN_HOPPER_BWD", "off", &o).ok() && !o.hopper_bwd);
  CHECK(parse_with("FUSEDATTN_HOPPER_BWD", "0", &o).ok() && !o.hopper_bwd);
  CHECK(parse_with("FUSEDATTN_HOPPER_CAUSAL_CHUNK", "65535", &o).ok() && o.hopper_causal_chunk == 65535);
  CHECK(parse_with("FUSEDATTN_HOPPER_CAUSAL_CHUNK", "auto", &o).ok() && o.hopper_causal_chunk == 0);
  CHECK(parse_with("FUSEDATTN_DECODE_SPLITS", "128", &o).ok() && o.decode_splits == 128);
  CHECK(parse_with("FUSEDATTN_DECODE_SPLITS", "3", &o).ok() && o.decode_splits == 3);
  CHECK(parse_with("FUSEDATTN_DECODE_PDL", "0", &o).ok() && o.decode_pdl == 0);
}

void test_bad_values() {
  const std::pair<const char*, const char*> bad[] = {
      {"FUSEDATTN_CUDA_ENGINE", "tc"},         {"FUSEDATTN_CUDA_ENGINE", "SIMT"},
      {"FUSEDATTN_HOPPER_FWD", "persistant"},  {"FUSEDATTN_HOPPER_BWD", "yes"},
      {"FUSEDATTN_HOPPER_BWD", "2"},           {"FUSEDATTN_HOPPER_CAUSAL_CHUNK", "two"},
      {"FUSEDATTN_HOPPER_CAUSAL_CHUNK", "-1"}, {"FUSEDATTN_HOPPER_CAUSAL_CHUNK", "65536"},
      {"FUSEDATTN_DECODE_SPLITS", "129"},      {"FUSEDATTN_DECODE_SPLITS", "3x"},
      {"FUSEDATTN_DECODE_SPLITS", " 3"},       {"FUSEDATTN_DECODE_PDL", "3"},
      {"FUSEDATTN_DECODE_PDL", "on"},
  };
  for (const auto& [var, value] : bad) {
    Overrides o;
    o.decode_pdl = 7;
    const Status st = parse_with(var, value, &o);
    CHECK_MSG(st.code == StatusCode::kInvalidArgument, "%s=%s accepted", var, value);
    CHECK_MSG(st.message.find(std::string(var) + "=" + value + " is not valid") != std::string::npos &&
                  st.message.find("accepted values:") != std::string::npos,
              "%s", st.message.c_str());
    CHECK(o.decode_pdl == 7);  // nothing written on failure
  }
  Overrides o;
  const Status st = parse_with("FUSEDATTN_HOPPER_FWD", "x", &o);
  CHECK_MSG(st.message.find("auto, v2, persistent, three_consumer, three_consumer_persistent") != std::string::npos,
            "%s", st.message.c_str());
}

}  // namespace

int main() {
  test_defaults();
  test_accepted_values();
  test_bad_values();
  return fa_test::finish("test_overrides");
}
