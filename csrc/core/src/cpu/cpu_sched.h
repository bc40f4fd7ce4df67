// Work distribution of the CPU engine: items are handed out dynamically
// (an atomic counter) to one worker per executor thread, heaviest first, so
// causal and varlen problems balance. Every item writes disjoint outputs, so
// results do not depend on which thread ran what.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "cpu_isa.h"
#include "fusedattn/api.h"

namespace fusedattn {
namespace cpu {
inline namespace FUSEDATTN_CPU_ISA {

// Minimal 64-byte aligned buffer; allocation failure is reported, not thrown.
template <class A>
class Buf {
 public:
  Buf() = default;
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  Buf(Buf&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  ~Buf() { release(); }

  bool alloc(size_t n) {
    release();
    if (n == 0) n = 1;
    p_ = static_cast<A*>(::operator new(n * sizeof(A), std::align_val_t(64), std::nothrow));
    n_ = p_ ? n : 0;
    return p_ != nullptr;
  }
  A* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  void release() {
    if (p_) ::operator delete(p_, std::align_val_t(64));
    p_ = nullptr;
    n_ = 0;
  }
  A* p_ = nullptr;
  size_t n_ = 0;
};

inline Status out_of_memory(const char* what) {
  return Status::Invalid(std::string("fusedattn CPU engine: out of memory allocating ") + what);
}

// Runs body(scratch, k) for k in [0, n). init() builds one worker's scratch and
// returns false when it cannot allocate it. Fails only if some item was left
// undone because no worker could allocate.
template <class Scratch, class Init, class Body>
Status parallel_items(const Executor& exec, int64_t n, Init&& init, Body&& body) {
  if (n <= 0) return Status::Ok();
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(exec.num_threads(), n));
  exec.parallel_for(workers, [&](int64_t, int64_t) {
    Scratch scratch;
    if (!init(scratch)) return;
    for (;;) {
      const int64_t k = next.fetch_add(1, std::memory_order_relaxed);
      if (k >= n) break;
      body(scratch, k);
    }
  });
  if (next.load() < n) return out_of_memory("per-thread scratch");
  return Status::Ok();
}

// Order of items by decreasing cost (stable, so deterministic).
template <class CostFn>
void order_by_cost(int64_t n, CostFn&& cost, std::vector<int64_t>* order) {
  std::vector<std::pair<int64_t, int64_t>> keyed(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) keyed[k] = {-cost(k), k};
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const std::pair<int64_t, int64_t>& x, const std::pair<int64_t, int64_t>& y) { return x.first < y.first; });
  order->resize(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) (*order)[k] = keyed[k].second;
}

}  // namespace FUSEDATTN_CPU_ISA
}  // namespace cpu
}  // namespace fusedattn
