// Decode probe: what limits reading the batch-1 decode call's K/V cache with the decode kernel's
// grid (docs/perf-notes.md, "## Decode (csrc/cuda/decode)": 15.3 us under ncu, 2.2 TB/s, though
// fewer instructions changed nothing). Every kernel here reads bytes and does no attention math:
// the decode kernel's data and grid (batch 1, 8192 keys, 8 KV heads, d = 128, bf16, bshd K and V
// of [1, 8192, 8, 128] each, 33.6 MB together; 128 threads a block; 64-key tiles of K + V =
// 32 KB) with one thing changed at a time, so the differences between the lines name the cost.
//
// Build (sm_90a, no torch):  tools/decode_probe/build.sh [OUT]    (default /tmp/decode_probe)
// Run (needs an sm_90 GPU and 4.7 GB of its memory; a few seconds in all, most of it setup): OUT
//
// Output, one line per measurement (30 launches; median and min of the single-launch times, each
// launch timed with CUDA events after a 256 MB L2 flush):
//   DPROBE <variant> <param>=<value> ... min_us=<min> us=<median> tbs=<bytes / median, TB/s>
// check=ok|FAIL on the line says whether every block, in every launch, reduced exactly the words it
// was meant to read (uint32 sum, compared with the host's); per variant, DPROBE-CHECK <variant>
// ok|FAIL, and DPROBE-MISMATCH lines name the first wrong block. A FAIL line's time means nothing.
// A summary table follows. Params: depth = pipeline stages (depth - 1 tiles in flight while one is
// consumed), keys = keys (256-byte rows of K and of V) per block, smem_kb = dynamic shared memory
// per block (raised to 105 KB, the decode kernel's, where the stages need less), bps = resident
// blocks per SM (occupancy API), waves = ceil(blocks / (bps x SMs)), flush = write (cudaMemset: L2
// left full of dirty lines whose write-backs compete with the reads, as bench_decode.py --profile's
// flush.add_) or read (a kernel reads the flush buffer: clean L2, as the rotating cache copies of
// bench_decode.py's timed calls).
//
// Variants and what comparing them tells:
//   empty           the launch and block-scheduling floor of the grid (no loads)
//   stream          contiguous 128 KB per block (64 KB of K, 64 KB of V), cp.async 16 B a thread
//   pattern         the decode kernel's reads: block (split, head) reads its head's 256-byte rows
//                   (2 KB apart) of keys [split*256, +256), cp.async 16 B a thread; vs stream: the
//                   access pattern; depth 2/3/4 and 3 blocks per SM: bytes in flight per SM
//   pattern-splits  16/32/64 splits a head (128/256/512 blocks): block count and lifetime
//   pattern-bulk    one cp.async.bulk of 256 B per row (one issuing thread per row), mbarrier
//   stream-bulk     the same on the contiguous layout
//   pattern-tma     one TMA tensor load per K (and V) tile: box 128 x 1 x 64, no swizzle, or two
//                   boxes 64 x 1 x 64 with the 128-byte swizzle; vs pattern: per-thread copies
//   chain           pattern depth 3 behind the decode kernel's dependent prologue: cu_seqlens
//                   (hops=2) then the page table, then the first tile; page=8192 is the contiguous
//                   cache (one page), page=16 randomly permuted 16-key pages; vs pattern depth=3
// Depth 4 needs 128 KB of stages: 1 block per SM, so 256 blocks take 2 waves on 132 SMs.
//
// Batch 64 / context 16384 (the library reads the contiguous cache at 4.36-4.48 TB/s, the same keys
// in randomly permuted 16-key pages 8-12% slower: layout or kernel?). K and V pools of 64 x 16384
// keys x 8 heads x 128 (2.15 GB each, 2 MB-aligned, filled on the device) seen as [pages, page
// size, 8, 128]; one block per (sequence, KV head): 512 blocks, depth 3, 105 KB (2 per SM), with the
// decode kernel's copy loop (every key's page read from the table one tile ahead into a shared
// offset ring). 10 launches each; tbs = 4.29 GB / median. Pages are 32 KB at page size 16.
//   b64-contig page=none    rows by arithmetic, no table: what the layout itself reads at
//   b64-contig page=16384   one page per sequence through the table, as the library reads a
//                           non-paged cache; vs page=none: the lookup loop
//   b64-paged16-sorted      page table = identity: the indirection at page 16, placement in order
//   b64-paged16-in2mb       pages permuted within each 2 MB (64 pages): random 32 KB placement,
//                           the same 2 MB GPU pages (TLB footprint) as in order: DRAM locality
//   b64-paged16-local       pages permuted within their sequence's 32 MB: a tile's 4 pages in up to
//                           4 GPU pages, 16 per sequence
//   b64-paged16             pages permuted over the whole pool, as the benchmark: vs in2mb and
//                           local, the cost of scattering over 2.15 GB (TLB misses)
//   b64-paged256            512 KB pages permuted over the pool: the same scatter in larger pieces
// paged16 ~ sorted ~ contig: the 8-12% is in the library kernel, not the layout.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../hopper/harness_common.h"  // CK, Rng, Conv; the ptx_sm90.cuh wrappers, get_encode_fn

namespace {

namespace hp = fusedattn::hopper;

constexpr int kKeys = 8192, kHeads = 8, kDim = 128;
constexpr int kRowBytes = kDim * 2;                         // one key of one head
constexpr int kRows = kKeys * kHeads;                       // 256-byte rows in each of K, V
constexpr size_t kCacheBytes = size_t(kRows) * kRowBytes;   // 16.8 MB each
constexpr int kThreads = 128;
constexpr int kBN = 64;                                     // keys per tile
constexpr int kHalfTile = kBN * kRowBytes;                  // the K (or V) half of a tile: 16 KB
constexpr int kTileBytes = 2 * kHalfTile;
constexpr int kChunks = kRowBytes / 16;                     // 16-byte chunks per row
constexpr int kRowStep = kThreads / kChunks;                // a thread copies every 8th row, one column
constexpr int kAlignSlack = 1024;                           // stages start 1024-aligned (128B-swizzle boxes)
constexpr int kDecodeSmem = 105 * 1024;                     // the decode kernel's: 2 blocks per SM
constexpr int kReps = 30;
constexpr size_t kFlushBytes = size_t(256) << 20;
static_assert(kThreads == 2 * kBN, "bulk: one thread per K row and one per V row of a tile");

enum class Copy { kNone, kCpAsync, kChain, kBulk, kTma };

struct Args {
  const unsigned char* k;
  const unsigned char* v;
  uint32_t* out;          // per block: the uint32 sum of every word it read
  int keys;               // rows of K (and of V) per block, a multiple of kBN
  int contiguous;         // 1: block b reads rows [b * keys, (b + 1) * keys); 0: keys of head blockIdx.y
  int tma_box;            // kTma: box width in elements (128 or 64)
  const int* cu_seqlens;  // kChain: {0, kKeys}
  const int* page_table;  // kChain: page of key t is page_table[t / page_size]
  int page_size;
  int len;                // kChain, hops = 1: the sequence length, given
  int hops;               // kChain: 2 = cu_seqlens, then the page table; 1 = page table only
};

// As the decode kernel's (csrc/cuda/decode/ptx.cuh): L2 only, 128-byte L2 prefetch, src-size operand.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// Consuming a landed tile: this thread's share of its 32-bit words, summed (what the check compares).
template <int BYTES>
__device__ __forceinline__ uint32_t sum_tile(const unsigned char* stage, int tid) {
  const uint4* t = reinterpret_cast<const uint4*>(stage);
  uint32_t acc = 0;
#pragma unroll
  for (int k = 0; k < BYTES / 16 / kThreads; ++k) {
    const uint4 w = t[tid + k * kThreads];
    acc += w.x + w.y + w.z + w.w;
  }
  return acc;
}

// The block's sum of every thread's acc, written by thread 0 to *out.
__device__ __forceinline__ void store_block_sum(uint32_t acc, uint32_t* red, uint32_t* out) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) *out = red[0] + red[1] + red[2] + red[3];
}

// Block (blockIdx.x, blockIdx.y) of a (splits, heads) grid, as the decode kernel's (split, KV head).
// Tiles stream through an S-stage ring with the decode kernel's loop: wait for tile x, barrier (every
// thread is done with tile x - 1's stage), issue tile x + S - 1 into that stage, consume tile x.
// Consuming = every thread sums its 16 of the tile's 16-byte chunks from shared memory.
template <Copy C, int S>
__global__ void __launch_bounds__(kThreads) probe_kernel(const __grid_constant__ CUtensorMap tmk,
                                                         const __grid_constant__ CUtensorMap tmv, const Args a) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t full[S];  // kBulk, kTma: tile landed, per stage
  __shared__ uint32_t red[kThreads / 32];
  constexpr bool kCp = C == Copy::kCpAsync || C == Copy::kChain;
  const int tid = threadIdx.x;
  const int b = blockIdx.y * gridDim.x + blockIdx.x;
  uint32_t acc = 0;

  if constexpr (C != Copy::kNone) {
    unsigned char* stages = smem_raw + ((0u - hp::smem_u32(smem_raw)) & (kAlignSlack - 1));
    int* off_s = reinterpret_cast<int*>(stages + S * kTileBytes);  // kChain: row of each of the block's keys
    const uint32_t sbase = hp::smem_u32(stages);
    const int n = a.keys / kBN;
    const int row0 = a.contiguous ? b * a.keys : blockIdx.x * a.keys * kHeads + blockIdx.y;
    const int rstride = a.contiguous ? 1 : kHeads;
    const auto row_of = [&](int j) -> size_t {  // row of the block's key j in K and V
      if constexpr (C == Copy::kChain) {
        return static_cast<size_t>(off_s[j]);
      } else {
        return static_cast<size_t>(row0 + j * rstride);
      }
    };
    const auto bar = [&](int x) { return hp::smem_u32(&full[x % S]); };

    if constexpr (C == Copy::kChain) {
      // The decode kernel's start: sequence length, then each key's page, before any tile. The
      // clamp makes the page-table index depend on the loaded length (the second round trip).
      const int len = a.hops == 2 ? __ldg(a.cu_seqlens + 1) - __ldg(a.cu_seqlens) : a.len;
      for (int j = tid; j < a.keys; j += kThreads) {
        const int tok = min(static_cast<int>(blockIdx.x) * a.keys + j, len - 1);
        const int pg = __ldg(a.page_table + tok / a.page_size);
        off_s[j] = (pg * a.page_size + tok % a.page_size) * kHeads + blockIdx.y;
      }
      __syncthreads();
    }
    if constexpr (C == Copy::kBulk || C == Copy::kTma) {
      if (tid == 0) {
#pragma unroll
        for (int s = 0; s < S; ++s) hp::mbar_init(hp::smem_u32(&full[s]), 1);
        hp::mbar_fence_init();
        if constexpr (C == Copy::kTma) {
          hp::tma_prefetch_desc(&tmk);
          hp::tma_prefetch_desc(&tmv);
        } else {
          // A tile's 128 row copies complete on its barrier; the one arrival (with the tile's bytes)
          // comes before any of them is issued (the barrier below), so tx-count never goes negative.
          for (int x = 0; x < S - 1 && x < n; ++x) hp::mbar_arrive_expect_tx(bar(x), kTileBytes);
        }
      }
      __syncthreads();
    }

    const int cc = tid % kChunks, r_first = tid / kChunks;
    const auto issue = [&](int x) {
      const uint32_t dst = sbase + (x % S) * kTileBytes;
      if constexpr (kCp) {
#pragma unroll
        for (int k = 0; k < kBN / kRowStep; ++k) {
          const int r = r_first + k * kRowStep;
          const size_t src = row_of(x * kBN + r) * kRowBytes + cc * 16;
          const uint32_t d = dst + r * kRowBytes + cc * 16;
          cp_async16(d, a.k + src);
          cp_async16(d + kHalfTile, a.v + src);
        }
      } else if constexpr (C == Copy::kBulk) {
        const int r = tid % kBN, half = tid / kBN;
        hp::bulk_g2s(dst + half * kHalfTile + r * kRowBytes, (half ? a.v : a.k) + row_of(x * kBN + r) * kRowBytes,
                     kRowBytes, bar(x));
      } else {
        if (tid == 0) {
          hp::mbar_arrive_expect_tx(bar(x), kTileBytes);
          const int key = blockIdx.x * a.keys + x * kBN;
          const uint32_t box_bytes = a.tma_box * 2 * kBN;
          for (int c = 0; c < kDim; c += a.tma_box) {
            const uint32_t o = (c / a.tma_box) * box_bytes;
            tma_load_3d(dst + o, &tmk, bar(x), c, blockIdx.y, key);
            tma_load_3d(dst + kHalfTile + o, &tmv, bar(x), c, blockIdx.y, key);
          }
        }
      }
    };

#pragma unroll
    for (int x = 0; x < S - 1; ++x) {
      if (x < n) issue(x);
      if constexpr (kCp) cp_async_commit();
    }
    for (int x = 0; x < n; ++x) {
      if constexpr (kCp) {
        cp_async_wait<S - 2>();
      } else {
        hp::mbar_wait<true>(bar(x), (x / S) & 1);
        // Tile x + S - 1's arrival goes on the barrier of tile x - 1, whose phase every thread saw
        // complete before the previous iteration's barrier.
        if constexpr (C == Copy::kBulk) {
          if (tid == 0 && x + S - 1 < n) hp::mbar_arrive_expect_tx(bar(x + S - 1), kTileBytes);
        }
      }
      __syncthreads();
      if (x + S - 1 < n) issue(x + S - 1);
      if constexpr (kCp) cp_async_commit();
      acc += sum_tile<kTileBytes>(stages + (x % S) * kTileBytes, tid);
    }
  }

  store_block_sum(acc, red, a.out + b);
}

// Reads the flush buffer so that L2 ends up holding its clean lines (flush=read).
__global__ void flush_read_kernel(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 w = p[i];
    acc ^= w.x ^ w.y ^ w.z ^ w.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // keeps the loads live
}

using KernFn = void (*)(CUtensorMap, CUtensorMap, Args);

template <Copy C>
KernFn by_depth(int s) {
  switch (s) {
    case 2: return probe_kernel<C, 2>;
    case 3: return probe_kernel<C, 3>;
    default: return probe_kernel<C, 4>;
  }
}

KernFn kernel_of(Copy c, int s) {
  switch (c) {
    case Copy::kNone: return probe_kernel<Copy::kNone, 2>;
    case Copy::kChain: return probe_kernel<Copy::kChain, 3>;
    case Copy::kCpAsync: return by_depth<Copy::kCpAsync>(s);
    case Copy::kBulk: return by_depth<Copy::kBulk>(s);
    default: return by_depth<Copy::kTma>(s);
  }
}

struct Cfg {
  const char* variant;
  Copy copy;
  int depth;
  int splits;      // per head; blocks = splits x kHeads
  bool contiguous;
  int smem_min;    // dynamic shared memory at least this (0: what the stages need)
  int tma_box;     // kTma: 128 (no swizzle) or 64 (128-byte swizzle)
  int hops;        // kChain
  int page_size;   // kChain
  bool flush_read;
};

struct Buffers {
  unsigned char* k;
  unsigned char* v;
  std::vector<uint32_t> row_sum_k, row_sum_v;  // uint32 sum of each 256-byte row's words
  uint32_t* out;
  unsigned char* flush;
  uint32_t* sink;
  int* cu_seqlens;
  int* pt_contig;  // page_size 8192: {0}
  int* pt_paged;   // page_size 16: a random permutation of the 512 pages
  std::vector<int> pt_paged_host;
  int sms;
};

// A kernel's dynamic shared memory raised to smem, then its resident blocks per SM (occupancy API)
// and the waves `blocks` blocks take on sms SMs.
struct Residency {
  int bps = 0, waves = 0;
};
template <class Kernel>
static Residency residency(Kernel kern, int smem, int blocks, int sms) {
  Residency r;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.bps, kern, kThreads, smem));
  r.waves = r.bps > 0 ? (blocks + r.bps * sms - 1) / (r.bps * sms) : 0;
  return r;
}

// One measurement's timing loop: rep -1 is a warm-up (module load), checked but not timed; before
// every launch the output words are poisoned (a block that writes nothing fails) and `flush(rep)`
// evicts L2; each launch is timed alone with events, and every block's word is compared with the
// host's expectation (the first mismatch of a launch is printed).
struct Timing {
  double median_us, min_us;
  bool ok;
};
template <class Flush, class Launch>
Timing time_checked(const std::string& label, int reps, const std::vector<uint32_t>& want, uint32_t* out,
                    cudaEvent_t ev0, cudaEvent_t ev1, Flush flush, Launch launch) {
  const int blocks = static_cast<int>(want.size());
  std::vector<uint32_t> got(blocks);
  std::vector<double> us;
  bool ok = true;
  for (int rep = -1; rep < reps; ++rep) {
    CK(cudaMemsetAsync(out, 0xA5, blocks * sizeof(uint32_t)));
    flush(rep);
    CK(cudaEventRecord(ev0));
    launch();
    CK(cudaGetLastError());
    CK(cudaEventRecord(ev1));
    CK(cudaEventSynchronize(ev1));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, ev0, ev1));
    CK(cudaMemcpy(got.data(), out, blocks * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    for (int i = 0; i < blocks && ok; ++i) {
      if (got[i] != want[i]) {
        ok = false;
        std::printf("DPROBE-MISMATCH %s rep=%d block=%d got=0x%08x want=0x%08x\n", label.c_str(), rep, i, got[i],
                    want[i]);
      }
    }
    if (rep >= 0) us.push_back(ms * 1000.0);
  }
  std::sort(us.begin(), us.end());
  const double med = reps % 2 ? us[reps / 2] : 0.5 * (us[reps / 2 - 1] + us[reps / 2]);
  return {med, us.front(), ok};
}

struct Result {
  std::string label;
  double us, tbs;
  bool ok;
  std::string variant;  // for DPROBE-CHECK
};

unsigned char* upload_cache(Rng& rng, std::vector<uint32_t>* row_sum) {
  std::vector<__nv_bfloat16> h(kCacheBytes / 2);
  for (auto& x : h) {
    float f = rng.uniform(-1.f, 1.f);
    if (f == 0.f) f = 0.015625f;  // never zero (bf16 keeps fp32's exponent range: only 0 rounds to 0)
    x = Conv<__nv_bfloat16>::from_f(f);
  }
  row_sum->assign(kRows, 0);
  for (int r = 0; r < kRows; ++r) {
    uint32_t s = 0;
    for (int w = 0; w < kRowBytes / 4; ++w) {
      uint32_t word;
      std::memcpy(&word, reinterpret_cast<const unsigned char*>(h.data()) + size_t(r) * kRowBytes + 4 * w, 4);
      s += word;
    }
    (*row_sum)[r] = s;
  }
  unsigned char* d = nullptr;
  CK(cudaMalloc(&d, kCacheBytes));
  CK(cudaMemcpy(d, h.data(), kCacheBytes, cudaMemcpyHostToDevice));
  return d;
}

// What each block must report: the sum over the rows it reads (the kernel's row mapping, on the host).
std::vector<uint32_t> expected_sums(const Cfg& c, const Buffers& B) {
  const int keys = kKeys / c.splits;
  std::vector<uint32_t> want(size_t(c.splits) * kHeads, 0);
  if (c.copy == Copy::kNone) return want;
  for (int h = 0; h < kHeads; ++h)
    for (int s = 0; s < c.splits; ++s) {
      const int b = h * c.splits + s;
      uint32_t sum = 0;
      for (int j = 0; j < keys; ++j) {
        const int key = s * keys + j;
        int row;
        if (c.contiguous) {
          row = b * keys + j;
        } else if (c.copy == Copy::kChain) {
          const int pg = c.page_size == kKeys ? 0 : B.pt_paged_host[key / c.page_size];
          row = (pg * c.page_size + key % c.page_size) * kHeads + h;
        } else {
          row = key * kHeads + h;
        }
        sum += B.row_sum_k[row] + B.row_sum_v[row];
      }
      want[b] = sum;
    }
  return want;
}

// K or V as the 3-D tensor (d, head, key); box (box_cols, 1, kBN) keys of one head.
bool make_map3(CUtensorMap* m, const void* base, int box_cols, int* cu_result) {
  const auto enc = hp::detail::get_encode_fn();
  if (enc == nullptr) {
    *cu_result = -1;
    return false;
  }
  const cuuint64_t dims[3] = {kDim, kHeads, kKeys};
  const cuuint64_t strides[2] = {kRowBytes, cuuint64_t(kHeads) * kRowBytes};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_cols), 1, kBN};
  const cuuint32_t estr[3] = {1, 1, 1};
  // No swizzle allows a 256-byte box row (boxDim[0] * 2 a multiple of 16, <= 256 elements); the
  // 128-byte swizzle caps a box row at 128 bytes.
  const CUtensorMapSwizzle swz = box_cols == kDim ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B;
  const CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box, estr,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, swz, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  *cu_result = static_cast<int>(r);
  return r == CUDA_SUCCESS;
}

Result measure(const Cfg& c, const Buffers& B, cudaEvent_t ev0, cudaEvent_t ev1) {
  const int keys = kKeys / c.splits;
  const int blocks = c.splits * kHeads;
  const KernFn kern = kernel_of(c.copy, c.depth);
  int smem = c.copy == Copy::kNone ? 0 : kAlignSlack + c.depth * kTileBytes;
  if (c.copy == Copy::kChain) smem += keys * 4;
  smem = std::max(smem, c.smem_min);
  const double bytes = c.copy == Copy::kNone ? 0.0 : 2.0 * kCacheBytes;

  std::string label = c.variant;
  if (c.copy != Copy::kNone) label += " depth=" + std::to_string(c.depth);
  if (c.copy == Copy::kTma) {
    label += " box=" + std::to_string(c.tma_box) + "x1x64 swizzle=" + (c.tma_box == kDim ? "none" : "128B");
  }
  if (c.copy == Copy::kChain) label += " hops=" + std::to_string(c.hops) + " page=" + std::to_string(c.page_size);
  label += " splits=" + std::to_string(c.splits) + " keys=" + std::to_string(keys) +
           " blocks=" + std::to_string(blocks);

  CUtensorMap tmk, tmv;
  std::memset(&tmk, 0, sizeof(tmk));
  std::memset(&tmv, 0, sizeof(tmv));
  if (c.copy == Copy::kTma) {
    int rk = 0, rv = 0;
    if (!make_map3(&tmk, B.k, c.tma_box, &rk) || !make_map3(&tmv, B.v, c.tma_box, &rv)) {
      std::printf("DPROBE-MISMATCH %s tensor map encode failed (CUresult %d, %d)\n", label.c_str(), rk, rv);
      return {label, 0.0, 0.0, false};
    }
  }

  const Residency res = residency(kern, smem, blocks, B.sms);

  Args a{};
  a.k = B.k;
  a.v = B.v;
  a.out = B.out;
  a.keys = keys;
  a.contiguous = c.contiguous ? 1 : 0;
  a.tma_box = c.tma_box;
  a.cu_seqlens = B.cu_seqlens;
  a.page_table = c.page_size == kKeys ? B.pt_contig : B.pt_paged;
  a.page_size = c.page_size;
  a.len = kKeys;
  a.hops = c.hops;

  const std::vector<uint32_t> want = expected_sums(c, B);
  const dim3 grid(c.splits, kHeads);
  const auto flush = [&](int rep) {
    if (c.flush_read) {
      flush_read_kernel<<<B.sms * 8, 256>>>(reinterpret_cast<const uint4*>(B.flush), kFlushBytes / 16, B.sink);
      CK(cudaGetLastError());
    } else {
      CK(cudaMemsetAsync(B.flush, rep & 0xff, kFlushBytes));
    }
  };
  const Timing tm = time_checked(label, kReps, want, B.out, ev0, ev1, flush,
                                 [&] { kern<<<grid, kThreads, smem>>>(tmk, tmv, a); });
  const bool ok = tm.ok;
  const double med = tm.median_us;
  const double tbs = bytes / (med * 1e-6) / 1e12;
  char tail[256];
  std::snprintf(tail, sizeof(tail), " smem_kb=%.1f bps=%d waves=%d flush=%s", smem / 1024.0, res.bps, res.waves,
                c.flush_read ? "read" : "write");
  label += tail;
  std::printf("DPROBE %s check=%s min_us=%.2f us=%.2f tbs=%.3f\n", label.c_str(), ok ? "ok" : "FAIL", tm.min_us, med,
              tbs);
  std::fflush(stdout);
  return {label, med, tbs, ok};
}

// ---- batch 64 / context 16384 ----
constexpr int kB64Batch = 64, kB64Keys = 16384, kB64Stages = 3, kB64Reps = 10;
constexpr int kB64Blocks = kB64Batch * kHeads;
constexpr int kB64Rows = kB64Batch * kB64Keys * kHeads;      // 256-byte rows in each of K, V
constexpr size_t kB64Bytes = size_t(kB64Rows) * kRowBytes;   // 2.15 GB each
constexpr size_t kGpuPage = size_t(2) << 20;                 // the large pages cudaMalloc maps
static_assert(kB64Stages * kTileBytes + kAlignSlack + kB64Stages * kBN * 16 <= kDecodeSmem, "fits 105 KB");

struct Args64 {
  const unsigned char* k;
  const unsigned char* v;
  uint32_t* out;          // per block (sequence * kHeads + head): the uint32 sum of the words it read
  const int* page_table;  // kTable: [kB64Batch, pages_per_seq]
  int page_size;
  int pages_per_seq;
  int num_pages;
};

// Block (0, head, sequence), as the decode kernel's grid at one split. kTable copies as the decode
// kernel does (csrc/cuda/decode/decode_kernel.cuh): threads tid < kBN read the page of key tid of
// tile x + S + 1 into a register while tile x is consumed, and write the (k, v) byte offsets of
// tile x + S into the shared ring, so a tile's copy never waits on the page table. Without kTable
// a row's offset is arithmetic (the contiguous [batch, keys, heads, d] layout).
template <bool kTable>
__global__ void __launch_bounds__(kThreads) b64_kernel(const Args64 a) {
  constexpr int S = kB64Stages, n = kB64Keys / kBN;
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint32_t red[kThreads / 32];
  unsigned char* stages = smem_raw + ((0u - hp::smem_u32(smem_raw)) & (kAlignSlack - 1));
  longlong2* off_s = reinterpret_cast<longlong2*>(stages + S * kTileBytes);  // [S][kBN]
  const uint32_t sbase = hp::smem_u32(stages);
  const int tid = threadIdx.x, h = blockIdx.y, seq = blockIdx.z;
  const int* pt = a.page_table + (kTable ? int64_t(seq) * a.pages_per_seq : 0);
  const int64_t last_page = a.num_pages - 1;

  const auto page_of = [&](int x) -> int64_t {  // clamped into the pool, as the decode kernel's
    const int64_t pg = __ldg(pt + (x * kBN + tid) / a.page_size);
    return pg < 0 ? 0 : (pg > last_page ? last_page : pg);
  };
  const auto put_offsets = [&](int x, int64_t pg) {
    const int64_t o = ((pg * a.page_size + (x * kBN + tid) % a.page_size) * kHeads + h) * kRowBytes;
    off_s[(x % S) * kBN + tid] = make_longlong2(o, o);
  };
  const int cc = tid % kChunks, r_first = tid / kChunks;
  const unsigned char* kc = a.k + cc * 16;
  const unsigned char* vc = a.v + cc * 16;
  const int64_t row0 = int64_t(seq) * kB64Keys * kHeads + h;
  const auto issue = [&](int x) {
    const uint32_t dst = sbase + (x % S) * kTileBytes;
#pragma unroll
    for (int k = 0; k < kBN / kRowStep; ++k) {
      const int r = r_first + k * kRowStep;
      longlong2 o;
      if constexpr (kTable) {
        o = off_s[(x % S) * kBN + r];
      } else {
        o.x = o.y = (row0 + int64_t(x * kBN + r) * kHeads) * kRowBytes;
      }
      const uint32_t d = dst + r * kRowBytes + cc * 16;
      cp_async16(d, kc + o.x);
      cp_async16(d + kHalfTile, vc + o.y);
    }
  };

  int64_t pid_next = -1;
  if constexpr (kTable) {
    if (tid < kBN) {
#pragma unroll
      for (int x = 0; x < S; ++x) put_offsets(x, page_of(x));
      pid_next = page_of(S);
    }
    __syncthreads();
  }
#pragma unroll
  for (int x = 0; x < S - 1; ++x) {
    issue(x);
    cp_async_commit();
  }
  uint32_t acc = 0;
  for (int x = 0; x < n; ++x) {
    cp_async_wait<S - 2>();
    __syncthreads();  // tile x landed; every thread is done with tile x - 1's stage and offsets
    if (x + S - 1 < n) issue(x + S - 1);
    cp_async_commit();
    if constexpr (kTable) {
      if (tid < kBN) {
        if (x + S < n) put_offsets(x + S, pid_next);
        pid_next = x + S + 1 < n ? page_of(x + S + 1) : -1;
      }
    }
    acc += sum_tile<kTileBytes>(stages + (x % S) * kTileBytes, tid);
  }
  store_block_sum(acc, red, a.out + seq * kHeads + h);
}

__host__ __device__ inline uint32_t hash32(uint32_t x) {  // lowbias32
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// bf16 element e = a hash of (e, seed) mapped to [-1, 1), never zero (a zero-filled or skipped
// chunk changes a block's sum); on the device: 2 x 2.15 GB in a few ms instead of host seconds.
__global__ void b64_fill_kernel(uint4* p, size_t n16, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n16; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t u = hash32(static_cast<uint32_t>(i * 8 + j) + seed);
      float f = static_cast<float>(u >> 8) * (2.f / 16777216.f) - 1.f;
      if (f == 0.f) f = 0.015625f;
      const uint32_t bits = __bfloat16_as_ushort(__float2bfloat16_rn(f));
      if (j % 2 == 0) {
        w[j / 2] = bits;
      } else {
        w[j / 2] |= bits << 16;
      }
    }
    p[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The reference: uint32 word sum of every 256-byte row by plain coalesced loads (16 threads a row,
// no shared memory, no page table), the table mapping applied on the host. n16 is a multiple of 32
// and the grid's stride too, so every lane of a warp takes part in each shuffle.
__global__ void b64_row_sum_kernel(const uint4* p, size_t n16, uint32_t* row_sum) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n16; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 w = p[i];
    uint32_t s = w.x + w.y + w.z + w.w;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (i % kChunks == 0) row_sum[i / kChunks] = s;
  }
}

struct B64Cfg {
  const char* variant;
  bool table;
  int page_size;
  const char* order;     // random | sorted | in2mb | local
  std::vector<int> pt;   // [kB64Batch, pages_per_seq]
};

struct B64Buffers {
  unsigned char* k;  // 2 MB-aligned inside k_raw
  unsigned char* v;
  unsigned char* k_raw;
  unsigned char* v_raw;
  int* pt;
  std::vector<uint32_t> row_sum_k, row_sum_v;
};

Result measure_b64(const B64Cfg& c, const Buffers& B, const B64Buffers& X, cudaEvent_t ev0, cudaEvent_t ev1) {
  const int pps = c.table ? kB64Keys / c.page_size : 0;
  std::string label = std::string(c.variant) + " depth=" + std::to_string(kB64Stages) +
                      " page=" + (c.table ? std::to_string(c.page_size) : std::string("none"));
  if (c.table) label += std::string(" order=") + c.order;
  label += " batch=" + std::to_string(kB64Batch) + " keys=" + std::to_string(kB64Keys) +
           " blocks=" + std::to_string(kB64Blocks);

  // Expected sums, on the host: the table mapping written independently of the kernel's. Heads
  // innermost: a key's 8 rows are adjacent in the row sums.
  std::vector<uint32_t> want(kB64Blocks, 0);
  for (int s = 0; s < kB64Batch; ++s)
    for (int t = 0; t < kB64Keys; ++t) {
      const size_t slot = c.table ? size_t(c.pt[size_t(s) * pps + t / c.page_size]) * c.page_size + t % c.page_size
                                  : size_t(s) * kB64Keys + t;
      for (int h = 0; h < kHeads; ++h) want[s * kHeads + h] += X.row_sum_k[slot * kHeads + h] + X.row_sum_v[slot * kHeads + h];
    }
  if (c.table) CK(cudaMemcpy(X.pt, c.pt.data(), c.pt.size() * sizeof(int), cudaMemcpyHostToDevice));

  const auto kern = c.table ? b64_kernel<true> : b64_kernel<false>;
  const int smem = kDecodeSmem;
  const Residency res = residency(kern, smem, kB64Blocks, B.sms);

  Args64 a{};
  a.k = X.k;
  a.v = X.v;
  a.out = B.out;
  a.page_table = X.pt;
  a.page_size = c.table ? c.page_size : kB64Keys;
  a.pages_per_seq = pps;
  a.num_pages = c.table ? kB64Batch * pps : kB64Batch;

  const dim3 grid(1, kHeads, kB64Batch);
  const Timing tm = time_checked(
      label, kB64Reps, want, B.out, ev0, ev1, [&](int rep) { CK(cudaMemsetAsync(B.flush, rep & 0xff, kFlushBytes)); },
      [&] { kern<<<grid, kThreads, smem>>>(a); });
  const bool ok = tm.ok;
  const double med = tm.median_us;
  const double tbs = 2.0 * kB64Bytes / (med * 1e-6) / 1e12;
  char tail[256];
  std::snprintf(tail, sizeof(tail), " smem_kb=%.1f bps=%d waves=%d flush=write", smem / 1024.0, res.bps, res.waves);
  label += tail;
  std::printf("DPROBE %s check=%s min_us=%.2f us=%.2f tbs=%.3f\n", label.c_str(), ok ? "ok" : "FAIL", tm.min_us, med,
              tbs);
  std::fflush(stdout);
  return {label, med, tbs, ok, c.variant};
}

// Allocates and fills the pools, runs every batch-64 variant, frees the pools.
void run_b64(const Buffers& B, cudaEvent_t ev0, cudaEvent_t ev1, std::vector<Result>* results) {
  B64Buffers X;
  CK(cudaMalloc(&X.k_raw, kB64Bytes + kGpuPage));
  CK(cudaMalloc(&X.v_raw, kB64Bytes + kGpuPage));
  const auto align = [](unsigned char* p) {
    return p + ((kGpuPage - reinterpret_cast<uintptr_t>(p) % kGpuPage) % kGpuPage);
  };
  X.k = align(X.k_raw);
  X.v = align(X.v_raw);
  CK(cudaMalloc(&X.pt, size_t(kB64Batch) * kB64Keys / 16 * sizeof(int)));
  uint32_t* row_sum = nullptr;
  CK(cudaMalloc(&row_sum, size_t(kB64Rows) * sizeof(uint32_t)));
  const size_t n16 = kB64Bytes / 16;
  X.row_sum_k.resize(kB64Rows);
  X.row_sum_v.resize(kB64Rows);
  for (int kv = 0; kv < 2; ++kv) {
    uint4* p = reinterpret_cast<uint4*>(kv ? X.v : X.k);
    b64_fill_kernel<<<B.sms * 16, 256>>>(p, n16, kv ? 0x5bd1e995u : 0x27d4eb2fu);
    CK(cudaGetLastError());
    b64_row_sum_kernel<<<B.sms * 16, 256>>>(p, n16, row_sum);
    CK(cudaGetLastError());
    CK(cudaMemcpy((kv ? X.row_sum_v : X.row_sum_k).data(), row_sum, size_t(kB64Rows) * sizeof(uint32_t),
                  cudaMemcpyDeviceToHost));
  }
  CK(cudaFree(row_sum));

  Rng rng(20240608);  // its own: the batch-1 data above stays what it was
  const auto shuffle = [&](std::vector<int>& v, size_t lo, size_t n) {  // Fisher-Yates of v[lo, lo + n)
    for (size_t i = n - 1; i > 0; --i) std::swap(v[lo + i], v[lo + rng.next() % (i + 1)]);
  };
  const auto table = [&](int page, size_t group) {  // pages in order, then permuted within groups
    std::vector<int> pt(size_t(kB64Batch) * kB64Keys / page);
    for (size_t i = 0; i < pt.size(); ++i) pt[i] = static_cast<int>(i);
    if (group > 1) {
      for (size_t lo = 0; lo < pt.size(); lo += group) shuffle(pt, lo, group);
    }
    return pt;
  };
  const size_t pool16 = size_t(kB64Batch) * kB64Keys / 16, per2mb = kGpuPage / (16 * kHeads * kRowBytes);
  std::vector<B64Cfg> cfgs;
  cfgs.push_back({"b64-contig", false, kB64Keys, "", {}});
  cfgs.push_back({"b64-contig", true, kB64Keys, "sorted", table(kB64Keys, 1)});
  cfgs.push_back({"b64-paged16-sorted", true, 16, "sorted", table(16, 1)});
  cfgs.push_back({"b64-paged16-in2mb", true, 16, "in2mb", table(16, per2mb)});
  cfgs.push_back({"b64-paged16-local", true, 16, "local", table(16, kB64Keys / 16)});
  cfgs.push_back({"b64-paged16", true, 16, "random", table(16, pool16)});
  cfgs.push_back({"b64-paged256", true, 256, "random", table(256, size_t(kB64Batch) * kB64Keys / 256)});
  for (const B64Cfg& c : cfgs) results->push_back(measure_b64(c, B, X, ev0, ev1));

  CK(cudaFree(X.k_raw));
  CK(cudaFree(X.v_raw));
  CK(cudaFree(X.pt));
}

}  // namespace

int main() {
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  if (prop.major != 9 || prop.minor != 0) {
    std::fprintf(stderr, "decode probe: needs an sm_90 GPU (found %s, sm_%d%d)\n", prop.name, prop.major, prop.minor);
    return 1;
  }
  int clock_khz = 0, mem_clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  CK(cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, dev));
  std::printf("DPROBE-DEVICE %s sms=%d l2_mb=%.1f smem_per_sm_kb=%zu sm_clock_mhz=%d mem_clock_mhz=%d\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, prop.sharedMemPerMultiprocessor / 1024,
              clock_khz / 1000, mem_clock_khz / 1000);

  Buffers B;
  B.sms = prop.multiProcessorCount;
  Rng rng(20240607);
  B.k = upload_cache(rng, &B.row_sum_k);
  B.v = upload_cache(rng, &B.row_sum_v);
  CK(cudaMalloc(&B.out, 64 * kHeads * sizeof(uint32_t)));  // up to 64 splits
  CK(cudaMalloc(&B.flush, kFlushBytes));
  CK(cudaMemset(B.flush, 1, kFlushBytes));
  CK(cudaMalloc(&B.sink, sizeof(uint32_t)));
  const int cu_host[2] = {0, kKeys};
  CK(cudaMalloc(&B.cu_seqlens, sizeof(cu_host)));
  CK(cudaMemcpy(B.cu_seqlens, cu_host, sizeof(cu_host), cudaMemcpyHostToDevice));
  const int zero = 0;
  CK(cudaMalloc(&B.pt_contig, sizeof(int)));
  CK(cudaMemcpy(B.pt_contig, &zero, sizeof(int), cudaMemcpyHostToDevice));
  B.pt_paged_host.resize(kKeys / 16);
  for (size_t i = 0; i < B.pt_paged_host.size(); ++i) B.pt_paged_host[i] = static_cast<int>(i);
  for (size_t i = B.pt_paged_host.size() - 1; i > 0; --i) {  // Fisher-Yates
    std::swap(B.pt_paged_host[i], B.pt_paged_host[rng.next() % (i + 1)]);
  }
  CK(cudaMalloc(&B.pt_paged, B.pt_paged_host.size() * sizeof(int)));
  CK(cudaMemcpy(B.pt_paged, B.pt_paged_host.data(), B.pt_paged_host.size() * sizeof(int), cudaMemcpyHostToDevice));
  cudaEvent_t ev0, ev1;
  CK(cudaEventCreate(&ev0));
  CK(cudaEventCreate(&ev1));

  const int S2 = kDecodeSmem;  // stages padded to the decode kernel's shared memory: 2 blocks per SM
  // {variant, copy, depth, splits, contiguous, smem_min, tma_box, hops, page_size, flush_read}
  const Cfg cfgs[] = {
      {"empty", Copy::kNone, 2, 32, false, 0, 0, 0, 0, false},
      {"empty", Copy::kNone, 2, 32, false, S2, 0, 0, 0, false},
      {"stream", Copy::kCpAsync, 2, 32, true, S2, 0, 0, 0, false},
      {"stream", Copy::kCpAsync, 3, 32, true, S2, 0, 0, 0, false},
      {"stream", Copy::kCpAsync, 4, 32, true, S2, 0, 0, 0, false},
      {"pattern", Copy::kCpAsync, 2, 32, false, S2, 0, 0, 0, false},
      {"pattern", Copy::kCpAsync, 3, 32, false, S2, 0, 0, 0, false},
      {"pattern", Copy::kCpAsync, 4, 32, false, S2, 0, 0, 0, false},
      {"pattern", Copy::kCpAsync, 2, 32, false, 0, 0, 0, 0, false},  // 65 KB: 3 blocks per SM
      {"pattern-splits", Copy::kCpAsync, 3, 16, false, S2, 0, 0, 0, false},
      {"pattern-splits", Copy::kCpAsync, 3, 32, false, S2, 0, 0, 0, false},
      {"pattern-splits", Copy::kCpAsync, 3, 64, false, S2, 0, 0, 0, false},
      {"pattern-bulk", Copy::kBulk, 2, 32, false, S2, 0, 0, 0, false},
      {"pattern-bulk", Copy::kBulk, 3, 32, false, S2, 0, 0, 0, false},
      {"pattern-bulk", Copy::kBulk, 4, 32, false, S2, 0, 0, 0, false},
      {"stream-bulk", Copy::kBulk, 3, 32, true, S2, 0, 0, 0, false},
      {"pattern-tma", Copy::kTma, 2, 32, false, S2, 128, 0, 0, false},
      {"pattern-tma", Copy::kTma, 3, 32, false, S2, 128, 0, 0, false},
      {"pattern-tma", Copy::kTma, 4, 32, false, S2, 128, 0, 0, false},
      {"pattern-tma", Copy::kTma, 2, 32, false, S2, 64, 0, 0, false},
      {"pattern-tma", Copy::kTma, 3, 32, false, S2, 64, 0, 0, false},
      {"pattern-tma", Copy::kTma, 4, 32, false, S2, 64, 0, 0, false},
      {"chain", Copy::kChain, 3, 32, false, S2, 0, 1, kKeys, false},
      {"chain", Copy::kChain, 3, 32, false, S2, 0, 2, kKeys, false},
      {"chain", Copy::kChain, 3, 32, false, S2, 0, 1, 16, false},
      {"chain", Copy::kChain, 3, 32, false, S2, 0, 2, 16, false},
      // Clean L2 instead of dirty: what the memset flush's write-backs cost.
      {"empty", Copy::kNone, 2, 32, false, S2, 0, 0, 0, true},
      {"stream", Copy::kCpAsync, 3, 32, true, S2, 0, 0, 0, true},
      {"pattern", Copy::kCpAsync, 3, 32, false, S2, 0, 0, 0, true},
      {"pattern-tma", Copy::kTma, 3, 32, false, S2, 128, 0, 0, true},
      {"chain", Copy::kChain, 3, 32, false, S2, 0, 2, kKeys, true},
  };

  std::vector<Result> results;
  for (const Cfg& c : cfgs) {
    results.push_back(measure(c, B, ev0, ev1));
    results.back().variant = c.variant;
  }
  run_b64(B, ev0, ev1, &results);

  std::printf("\nsummary (median of %d launches, b64-*: %d; TB/s = 33.55 MB, b64-*: %.0f MB, / median)\n", kReps,
              kB64Reps, 2.0 * kB64Bytes / 1e6);
  size_t width = 0;
  for (const Result& r : results) width = std::max(width, r.label.size());
  const int w = static_cast<int>(width);
  std::printf("%-*s %8s %7s %5s\n", w, "measurement", "us", "TB/s", "check");
  for (const Result& r : results) {
    std::printf("%-*s %8.2f %7.3f %5s\n", w, r.label.c_str(), r.us, r.tbs, r.ok ? "ok" : "FAIL");
  }
  std::vector<std::string> variants;
  for (const Result& r : results) {
    if (std::find(variants.begin(), variants.end(), r.variant) == variants.end()) variants.push_back(r.variant);
  }
  for (const std::string& v : variants) {
    bool ok = true;
    for (const Result& r : results) ok = ok && (r.variant != v || r.ok);
    std::printf("DPROBE-CHECK %s %s\n", v.c_str(), ok ? "ok" : "FAIL");
  }

  CK(cudaEventDestroy(ev0));
  CK(cudaEventDestroy(ev1));
  CK(cudaFree(B.k));
  CK(cudaFree(B.v));
  CK(cudaFree(B.out));
  CK(cudaFree(B.flush));
  CK(cudaFree(B.sink));
  CK(cudaFree(B.cu_seqlens));
  CK(cudaFree(B.pt_contig));
  CK(cudaFree(B.pt_paged));
  return 0;
}
