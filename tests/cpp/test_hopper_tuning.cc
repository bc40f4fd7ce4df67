// The Hopper forward's host-side choices (csrc/cuda/hopper/tuning.h, torch- and CUDA-free): the
// persistent kernel's tile-balance model against tools/hopper/v3_protocol_model.py's balance()
// on the shapes measured on the H200, the schedule and variant each of those shapes gets, and the
// general forward's consumer count by its band.
#include <cmath>
#include <cstdio>

#include "../../csrc/cuda/hopper/tuning.h"
#include "attn_test_util.h"

namespace {

using fusedattn::hopper::choose_causal_chunk;
using fusedattn::hopper::choose_fwd_variant;
using fusedattn::hopper::band_keys_per_row;
using fusedattn::hopper::choose_v3_schedule;
using fusedattn::hopper::FwdVariant;
using fusedattn::hopper::general_fwd_consumers;
using fusedattn::hopper::GeneralBand;
using fusedattn::hopper::V3Grid;
using fusedattn::hopper::V3Schedule;
using fusedattn::hopper::v3_snake_imbalance;

// The bench grid's shape at head dim d (b * s = 16k tokens, h * d = 2048) on 132 SMs.
V3Grid bench_grid(int d, int64_t s) {
  V3Grid g;
  g.n_m = (s + 127) / 128;
  g.n_hb = (2048 / d) * (16384 / s);
  g.s_kv = s;
  g.g = 132;
  g.bm = 128;
  g.bn = d == 256 ? 80 : 128;
  return g;
}

struct ModelCase {
  int d;
  int64_t s;
  double snake, head_major;  // v3_protocol_model.balance(s, h, b, BN, 132)
  V3Schedule want;
};

void test_model_and_schedule() {
  const ModelCase cases[] = {
      {128, 16384, 1.0023, 1.5429, V3Schedule::kSnake},  // measured: head-major 0.68x v2, snake 0.98x
      {128, 512, 1.0312, 1.0312, V3Schedule::kSnakeHeadMajor},
      {256, 8192, 1.0060, 1.5349, V3Schedule::kSnake},  // measured: head-major 0.77x v2, snake 1.09x
      {256, 1024, 1.0312, 1.0820, V3Schedule::kSnakeHeadMajor},  // measured: head-major 1.10x, snake 0.83x
      {256, 4096, 1.0000, 1.0337, V3Schedule::kSnakeHeadMajor},
  };
  for (const ModelCase& c : cases) {
    const V3Grid g = bench_grid(c.d, c.s);
    const double sn = v3_snake_imbalance(g, false), hm = v3_snake_imbalance(g, true);
    CHECK_MSG(std::fabs(sn - c.snake) < 1e-3, "d=%d s=%lld snake %.4f, model.py %.4f", c.d,
              static_cast<long long>(c.s), sn, c.snake);
    CHECK_MSG(std::fabs(hm - c.head_major) < 1e-3, "d=%d s=%lld head-major %.4f, model.py %.4f", c.d,
              static_cast<long long>(c.s), hm, c.head_major);
    // Twice: the second answer comes from the per-thread cache and must be the same.
    for (int rep = 0; rep < 2; ++rep) {
      CHECK_MSG(choose_v3_schedule(g) == c.want, "d=%d s=%lld rep %d: schedule", c.d, static_cast<long long>(c.s),
                rep);
    }
  }
  // A grid with fewer tiles than CTAs: every CTA one tile, the busiest is the longest.
  V3Grid small;
  small.n_m = 4;
  small.n_hb = 2;
  small.s_kv = 512;
  small.g = 132;
  const double want = 4.0 / ((4 + 3 + 2 + 1) * 2 / 8.0);
  CHECK_MSG(std::fabs(v3_snake_imbalance(small, true) - want) < 1e-12, "8 tiles on 132 CTAs: %.4f",
            v3_snake_imbalance(small, true));
  // Above 2^17 tiles the model is not run: snake.
  V3Grid huge = bench_grid(128, 2048);
  huge.n_hb = (int64_t{1} << 17) / huge.n_m + 1;
  CHECK(choose_v3_schedule(huge) == V3Schedule::kSnake);
}

void test_variants() {
  CHECK(choose_fwd_variant(64, true, 1024) == FwdVariant::kPersistent);
  CHECK(choose_fwd_variant(64, false, 512) == FwdVariant::kThreeConsumerPersistent);
  CHECK(choose_fwd_variant(64, false, 1024) == FwdVariant::kThreeConsumerPersistent);
  CHECK(choose_fwd_variant(64, true, 1025) == FwdVariant::kThreeConsumerPersistent);
  CHECK(choose_fwd_variant(64, true, 2048) == FwdVariant::kThreeConsumerPersistent);
  CHECK(choose_fwd_variant(64, false, 2048) == FwdVariant::kThreeConsumerPersistent);
  CHECK(choose_fwd_variant(64, false, 2049) == FwdVariant::kThreeConsumer);
  CHECK(choose_fwd_variant(64, true, 4096) == FwdVariant::kThreeConsumer);
  CHECK(choose_fwd_variant(128, true, 8192) == FwdVariant::kPersistent);
  CHECK(choose_fwd_variant(128, true, 16384) == FwdVariant::kOneTile);
  CHECK(choose_fwd_variant(256, true, 512) == FwdVariant::kPersistent);
  CHECK(choose_fwd_variant(128, false, 4096) == FwdVariant::kPersistent);
  CHECK(choose_fwd_variant(128, false, 16384) == FwdVariant::kPersistent);
  CHECK(choose_fwd_variant(256, false, 8192) == FwdVariant::kPersistent);
  CHECK(choose_fwd_variant(256, false, 32768) == FwdVariant::kPersistent);
}

// The same choices as tools/hopper/bwd_order_model.py's choose_chunk on the benchmark's shapes.
void test_causal_chunk() {
  CHECK(choose_causal_chunk(16, 128, 132) == 16);  // d = 128, s = 2k: 264 / 16 = 16.5
  CHECK(choose_causal_chunk(32, 64, 132) == 8);    // d = 128, s = 4k
  CHECK(choose_causal_chunk(64, 32, 132) == 4);    // d = 128, s = 8k
  CHECK(choose_causal_chunk(128, 16, 132) == 2);   // d = 128, s = 16k
  CHECK(choose_causal_chunk(256, 8, 132) == 1);    // d = 256, s = 16k: one chunk would hold less
  CHECK(choose_causal_chunk(8, 4, 132) == 4);      // capped at the group count
  CHECK(choose_causal_chunk(8, 1, 132) == 1);      // one group: nothing to interleave
  CHECK(choose_causal_chunk(8, 512, 0) == 1);      // SM count unknown: group by group
  CHECK(choose_causal_chunk(int64_t{1} << 20, int64_t{1} << 12, 132) == 1);  // past int
}

// The general forward's consumer count at d = 64: key tiles counted by hand for 128- and 192-row
// tiles of 128-key tiles (rows r0 = 128 m, or 192 m alternating between 0 and 64 past a key tile).
void test_general_consumers() {
  // Window 128 (gpt-oss, keys i - 127 .. i): 2 key tiles per 128 rows, 3 per 192 rows.
  const GeneralBand w128{127, 0, 0};
  CHECK(band_keys_per_row(w128, 128, 128) == 256.0);
  CHECK(band_keys_per_row(w128, 192, 128) == 384.0);
  CHECK(general_fwd_consumers(64, false, w128, 128) == 2);
  // Window 4096 (Mistral): 33 against 34 key tiles, which three consumers' rate covers.
  const GeneralBand w4k{4095, 0, 0};
  CHECK(band_keys_per_row(w4k, 128, 128) == 33 * 128.0);
  CHECK(band_keys_per_row(w4k, 192, 128) == 34 * 128.0);
  CHECK(general_fwd_consumers(64, false, w4k, 128) == 3);
  // The diagonal shifts the band against the key tiles: 64 keys on, window 127 spans 3 tiles at 128 rows.
  CHECK(band_keys_per_row(GeneralBand{127, 0, 64}, 128, 128) == 384.0);
  CHECK(band_keys_per_row(GeneralBand{127, 0, 64 - 128 * 5}, 128, 128) == 384.0);  // the same alignment
  // Unbounded on a side (causal, or no left window): three; other head dims and softcap: two.
  CHECK(general_fwd_consumers(64, false, GeneralBand{-1, 0, 0}, 128) == 3);
  CHECK(general_fwd_consumers(64, false, GeneralBand{127, -1, 0}, 128) == 3);
  CHECK(general_fwd_consumers(64, true, GeneralBand{-1, 0, 0}, 128) == 2);
  CHECK(general_fwd_consumers(128, false, GeneralBand{-1, 0, 0}, 128) == 2);
}

}  // namespace

int main() {
  test_model_and_schedule();
  test_variants();
  test_causal_chunk();
  test_general_consumers();
  return fa_test::finish("test_hopper_tuning");
}
