// The torch-free KV-cache append (fusedattn/kv_cache.h): argument checks with
// messages that name the argument, the CPU engine's writes for bshd / sbhd /
// thd and strided inputs, and its rejection of bad device data before any
// write.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "attn_test_util.h"
#include "fusedattn/kv_cache.h"

namespace {

using namespace fusedattn;

TensorRef ref(void* data, DType dt, std::vector<int64_t> sizes, std::vector<int64_t> strides = {}) {
  TensorRef r;
  r.data = data;
  r.dtype = dt;
  r.ndim = static_cast<int>(sizes.size());
  if (strides.empty()) {
    strides.assign(sizes.size(), 1);
    for (int i = r.ndim - 2; i >= 0; --i) strides[i] = strides[i + 1] * sizes[i + 1];
  }
  for (int i = 0; i < r.ndim; ++i) {
    r.sizes[i] = sizes[i];
    r.strides[i] = strides[i];
  }
  return r;
}

constexpr int64_t kH = 2, kD = 8, kPages = 6, kPs = 4;

struct Case {
  Format fmt;
  std::vector<float> nk, nv, kc, vc;
  std::vector<int32_t> pt{5, 0, 3, 1, 2, 4};  // [2, 3]
  std::vector<int32_t> cu, sl{3, 0};
  int64_t s = 0;  // bshd/sbhd: padded step length; thd: tokens
  KvAppendArgs args;

  explicit Case(Format f) : fmt(f) {
    // sequence 0: 3 cached + 4 new (crosses into its second page); sequence 1: 0 + 2.
    cu = {0, 4, 6};
    s = f == Format::kTHD ? 7 : 4;
    const int64_t rows = f == Format::kTHD ? s : 2 * s;
    nk.resize(static_cast<size_t>(rows * kH * kD));
    nv.resize(nk.size());
    for (size_t i = 0; i < nk.size(); ++i) {
      nk[i] = static_cast<float>(i) + 0.25f;
      nv[i] = -static_cast<float>(i);
    }
    kc.assign(static_cast<size_t>(kPages * kPs * kH * kD), 7.f);
    vc = kc;
    args.new_format = f;
    const std::vector<int64_t> shape = f == Format::kTHD   ? std::vector<int64_t>{s, kH, kD}
                                       : f == Format::kBSHD ? std::vector<int64_t>{2, s, kH, kD}
                                                            : std::vector<int64_t>{s, 2, kH, kD};
    args.new_k = ref(nk.data(), DType::kFloat32, shape);
    args.new_v = ref(nv.data(), DType::kFloat32, shape);
    args.k_cache = ref(kc.data(), DType::kFloat32, {kPages, kPs, kH, kD});
    args.v_cache = ref(vc.data(), DType::kFloat32, {kPages, kPs, kH, kD});
    args.page_table = ref(pt.data(), DType::kInt32, {2, 3});
    args.cu_new_lens = ref(cu.data(), DType::kInt32, {3});
    args.cache_seqlens = ref(sl.data(), DType::kInt32, {2});
  }

  // Row of new token i of sequence b in new_k/new_v (elements).
  int64_t src_row(int64_t b, int64_t i) const {
    switch (fmt) {
      case Format::kBSHD: return (b * s + i) * kH * kD;
      case Format::kSBHD: return (i * 2 + b) * kH * kD;
      default: return (cu[b] + i) * kH * kD;
    }
  }
};

void test_writes(Format f) {
  Case c(f);
  KvAppendParams p;
  const Status st = make_kv_append_params(c.args, &p);
  CHECK_MSG(st.ok(), "%s", st.message.c_str());
  CHECK(p.capacity == 3 * kPs);
  const Status run = run_kv_append_cpu(p);
  CHECK_MSG(run.ok(), "%s", run.message.c_str());
  std::vector<float> want_k(c.kc.size(), 7.f), want_v(c.vc.size(), 7.f);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < c.cu[b + 1] - c.cu[b]; ++i) {
      const int64_t pos = c.sl[b] + i, page = c.pt[b * 3 + pos / kPs], slot = pos % kPs;
      for (int64_t e = 0; e < kH * kD; ++e) {
        want_k[(page * kPs + slot) * kH * kD + e] = c.nk[c.src_row(b, i) + e];
        want_v[(page * kPs + slot) * kH * kD + e] = c.nv[c.src_row(b, i) + e];
      }
    }
  }
  CHECK_MSG(c.kc == want_k && c.vc == want_v, "format %s: cache contents differ", format_name(f));
}

void test_strided_source() {
  // new_k / new_v as views of one [b, s, h, 2, d] buffer (a packed projection).
  Case c(Format::kBSHD);
  std::vector<float> packed(static_cast<size_t>(2 * 4 * kH * 2 * kD));
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<float>(i);
  const std::vector<int64_t> st{4 * kH * 2 * kD, kH * 2 * kD, 2 * kD, 1};
  c.args.new_k = ref(packed.data(), DType::kFloat32, {2, 4, kH, kD}, st);
  c.args.new_v = ref(packed.data() + kD, DType::kFloat32, {2, 4, kH, kD}, st);
  KvAppendParams p;
  CHECK(make_kv_append_params(c.args, &p).ok());
  CHECK(run_kv_append_cpu(p).ok());
  // sequence 1, token 1 -> page pt[1, 0] = 1, slot 1; head 1, element 3
  const int64_t src = 1 * st[0] + 1 * st[1] + 1 * st[2] + 3;
  const int64_t dst = (1 * kPs + 1) * kH * kD + 1 * kD + 3;
  CHECK(c.kc[dst] == packed[src] && c.vc[dst] == packed[src + kD]);
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

void test_argument_errors() {
  {
    Case c(Format::kBSHD);
    c.args.k_cache.dtype = DType::kFloat16;
    const Status st = check_kv_append(c.args);
    CHECK_MSG(!st.ok() && contains(st.message, "k_cache must have new_k's dtype"), "%s", st.message.c_str());
  }
  {
    Case c(Format::kBSHD);
    c.args.page_table.sizes[0] = 3;
    const Status st = check_kv_append(c.args);
    CHECK_MSG(!st.ok() && contains(st.message, "page_table must be an int32 tensor of shape [2, max_pages_per_seq]"),
              "%s", st.message.c_str());
  }
  {
    Case c(Format::kTHD);
    c.args.cache_seqlens.sizes[0] = 3;
    const Status st = check_kv_append(c.args);
    CHECK_MSG(!st.ok() && contains(st.message, "cache_seqlens"), "%s", st.message.c_str());
  }
  {
    Case c(Format::kBSHD);
    c.args.page_table.strides[1] = 2;
    const Status st = check_kv_append(c.args);
    CHECK_MSG(!st.ok() && contains(st.message, "rows must be contiguous"), "%s", st.message.c_str());
  }
  {
    Case c(Format::kBSHD);
    c.args.v_cache.sizes[2] = 1;
    const Status st = check_kv_append(c.args);
    CHECK_MSG(!st.ok() && contains(st.message, "k_cache and v_cache must agree"), "%s", st.message.c_str());
  }
}

// Bad data: rejected before anything is written.
void test_data_errors() {
  struct Bad {
    const char* what;
    void (*apply)(Case&);
    const char* msg;
  };
  const Bad bad[] = {
      {"past capacity", [](Case& c) { c.sl[0] = 9; }, "page table holds"},
      {"page outside pool", [](Case& c) { c.pt[1] = kPages; }, "outside the page pool"},
      {"decreasing cu", [](Case& c) { c.cu[2] = 3; }, "non-decreasing"},
      {"negative length", [](Case& c) { c.sl[1] = -1; }, "cache_seqlens[1] must be >= 0"},
      {"step too long", [](Case& c) { c.cu = {0, 5, 6}; }, "does not fit"},
  };
  for (const Bad& b : bad) {
    Case c(Format::kBSHD);
    b.apply(c);
    KvAppendParams p;
    CHECK(make_kv_append_params(c.args, &p).ok());
    const Status st = run_kv_append_cpu(p);
    CHECK_MSG(!st.ok() && st.code == StatusCode::kInvalidArgument && contains(st.message, b.msg), "%s: %s", b.what,
              st.message.c_str());
    bool untouched = true;
    for (float x : c.kc) untouched &= x == 7.f;
    for (float x : c.vc) untouched &= x == 7.f;
    CHECK_MSG(untouched, "%s: the caches were written", b.what);
  }
}

}  // namespace

int main() {
  test_writes(Format::kBSHD);
  test_writes(Format::kSBHD);
  test_writes(Format::kTHD);
  test_strided_source();
  test_argument_errors();
  test_data_errors();
  return fa_test::finish("test_kv_cache");
}
