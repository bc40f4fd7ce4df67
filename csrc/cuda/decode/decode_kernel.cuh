// The decode kernel (see tile.h for the block's shape and decode.h for the
// split-KV scheme).
//
// Per block: Q rows of one KV head's group -> shared memory once; then key
// tiles of BN keys stream through a STAGES-deep cp.async ring. The page of
// every key of a tile is looked up one tile ahead of its copy (a register per
// thread, then a (k, v) element-offset table in shared memory), so the copy
// of tile x + STAGES - 1 never waits on a page-table read. Per tile and warp:
// S = Q K^T (mma.sync m16n8k16, fp32), scale, ALiBi, mask, online softmax in
// exp2, P (rounded to the input dtype) . V into fp32 registers. At the end the
// warps' partial softmax states merge in shared memory and the block writes
// either the final output and lse (one split) or its normalised partial O and
// log2-lse to the workspace (several splits; decode_combine_kernel finishes).
// In a KV-cache step (KernelArgs::cache_seqlens) the keys past a sequence's
// cache are its new tokens, read from new_k / new_v; their owner blocks write
// them into the cache (write_new_tokens).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <climits>

#include "decode.h"
#include "epilogue.cuh"
#include "launch.cuh"
#include "ptx.cuh"
#include "common/host.h"
#include "common/numeric.cuh"
#include "common/seq.cuh"
#include "tile.h"

namespace fusedattn {
namespace decode {

using gpu::SeqInfo;

// The KV-cache step's tokens of (sequence b, KV head hk) that this block owns (KernelArgs), copied
// from new_k / new_v into their cache slots in 16-byte pieces (plan_step checked the rows). A token
// whose position is negative or past the page table, or whose page is outside the pool, is skipped
// (kv_cache.h: the CUDA engines never write out of bounds).
template <class T>
__device__ __forceinline__ void write_new_tokens(const FwdParams& p, const KernelArgs& a, const SeqInfo& si, int b,
                                                 int hk, int cached, int owner, int owners) {
  const int ck = static_cast<int>(p.prob.d_qk) / 8, cv = static_cast<int>(p.prob.d_v) / 8;
  for (int i = owner; i < si.len_q; i += owners) {
    const int64_t pos = int64_t(cached) + i;
    if (cached < 0 || pos >= p.paged.max_pages * p.paged.page_size) continue;
    const int64_t page = kv_page_of(p.paged, b, pos);
    if (page < 0 || page >= p.paged.num_pages) continue;
    const int64_t slot = a.div_ps.mod(static_cast<uint32_t>(pos));
    const int64_t tok = si.tok_q + i;
    for (int u = threadIdx.x; u < ck + cv; u += kThreads) {
      const bool is_k = u < ck;
      const SeqTensor& src = is_k ? a.new_k : a.new_v;
      const SeqTensor& dst = is_k ? p.k : p.v;
      const int c = (is_k ? u : u - ck) * 8;
      const T* s = static_cast<const T*>(src.data) + gpu::row_base(src, b, tok, hk) + c;
      T* d = static_cast<T*>(dst.data) + page * dst.stride_b + slot * dst.stride_s + int64_t(hk) * dst.stride_h + c;
      *reinterpret_cast<uint4*>(d) = __ldg(reinterpret_cast<const uint4*>(s));
    }
  }
}

template <class T, int D, int WM>
__global__ void __launch_bounds__(kThreads) decode_kernel(const FwdParams p, const KernelArgs a) {
  using C = Tile<D, WM>;
  constexpr int M = C::M, BN = C::BN, KW = C::KW, KS = C::KS, WN = C::kWN, S = C::STAGES, CH = C::CH, OS = C::OS;
  constexpr int RB = D * 2;  // bytes per smem row of Q, K, V

  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* q_s = smem;
  unsigned char* k_s = smem + C::kQBytes;
  unsigned char* v_s = k_s + S * C::kStageBytes;
  longlong2* off_s = reinterpret_cast<longlong2*>(v_s + S * C::kStageBytes);  // [S][BN] (k, v) offsets
  float* o_s = reinterpret_cast<float*>(k_s);                                  // epilogue [WN][M][OS]
  __shared__ float red_m[WN][M], red_l[WN][M];
  __shared__ float row_m[M], row_l[M];

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the work before it (KernelArgs::pdl_main): nothing of
  // global memory is touched until that work is complete and visible (its outputs may be this
  // call's inputs, and this call's outputs may reuse its memory). Otherwise this returns at once.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  if (p.rng_out_zero != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x < 2) {
    p.rng_out_zero[threadIdx.x] = 0;
  }

  const Problem& pr = p.prob;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WN, wn = warp % WN;
  const int g = lane >> 2, t4 = lane & 3;
  const int split = blockIdx.x;
  const int h_kv = static_cast<int>(pr.h_kv);
  const int hk = static_cast<int>(a.div_hkv.mod(blockIdx.y));
  const int row0 = static_cast<int>(a.div_hkv.div(blockIdx.y)) * M;
  const int b = blockIdx.z;
  const int group = a.group;
  // A one-page table (a contiguous cache: s_kv = page_size, so every key is on entry 0) is read
  // here, alongside cu_seqlens, rather than after the split's tiles are known from the length. A
  // step's per-sequence caches have no table: sequence b is page b.
  const int32_t* pt = p.paged.page_table + (p.paged.page_table != nullptr ? int64_t(b) * p.paged.stride_b : 0);
  const bool one_page = p.paged.max_pages == 1;
  const int32_t entry0 = one_page ? (pt != nullptr ? __ldg(pt) : b) : 0;
  const int dqk = static_cast<int>(pr.d_qk), dv = static_cast<int>(pr.d_v);
  const bool step = a.cache_seqlens != nullptr;
  const int cached_raw = step ? __ldg(a.cache_seqlens + b) : 0;

  SeqInfo si = gpu::seq_info(p, b);
  // A step's keys: the cache's (clamped into the page table), then the new tokens (kv_cache.h),
  // which are read from new_k / new_v from key c_new on.
  int c_new = INT_MAX;
  if (step) {
    const int s_kv = static_cast<int>(pr.s_kv);
    c_new = min(max(cached_raw, 0), s_kv);
    si.len_kv = static_cast<int>(min(kv_step_len(c_new, si.len_q), int64_t(s_kv)));
    si.vis = Visibility<int>::make(static_cast<int>(p.mask.window_left), static_cast<int>(p.mask.window_right),
                                   p.mask.bottom_right, si.len_q, si.len_kv);
  }

  // Valid rows of the block: r < rows and query i = r / group < len_q. The
  // keys any of them may see form [lo, hi) (bounds grow with i).
  const int r_end = min(row0 + M, a.rows);
  const int i_first = static_cast<int>(a.div_group.div(row0));
  const int i_last = min(static_cast<int>(a.div_group.div(r_end - 1)), si.len_q - 1);
  int lo = 0, hi = 0;
  if (i_first <= i_last) {
    lo = gpu::key_range(si, i_first).lo;
    hi = gpu::key_range(si, i_last).hi;
  }
  // This split's tiles [t0, t0 + n).
  int t0 = 0, n = 0;
  if (hi > lo) {
    const int t_lo = lo / BN, t_hi = (hi + BN - 1) / BN;
    const int per = static_cast<int>(a.div_splits.div(t_hi - t_lo + a.splits - 1));
    t0 = t_lo + split * per;
    n = max(0, min(t_hi, t0 + per) - t0);
  }

  const T* qg = static_cast<const T*>(p.q.data);
  const T* kg = static_cast<const T*>(p.k.data);
  const T* vg = static_cast<const T*>(p.v.data);
  const int64_t last_page = p.paged.num_pages - 1;

  // Page-table entry of key `tid` of tile x (threads tid < BN) and whether that key is in the
  // cache. The entry is read raw and clamped only where it is used, a tile later: a clamp right
  // behind the read made the warp wait for the read's round trip in every tile (SASS: the compare
  // followed the LDG; docs/perf-notes.md has the cost). A page index
  // outside the pool is clamped into it: a bad table gives wrong numbers, never an out-of-bounds
  // read (the CPU engine reports it).
  const auto clamp_page = [&](int64_t pg) -> int64_t { return pg < 0 ? 0 : (pg > last_page ? last_page : pg); };
  const auto key_live = [&](int x) { return x < n && (t0 + x) * BN + tid < si.len_kv; };
  const auto entry_of = [&](int x, bool live) -> int32_t {
    const int tok = (t0 + x) * BN + tid;
    int32_t e = 0;
    if (live && tok < c_new) e = one_page ? entry0 : __ldg(pt + a.div_ps.div(tok));
    return e;
  };
  // Key tid of tile x: its K and V rows as element offsets from kg / vg (kNoKey: not in the cache,
  // zero-filled). A step's new token i lives in new_k / new_v, at new_k_off + i * stride_s: the
  // distance between flat addresses (both tensors hold T, so it is a whole number of elements).
  int64_t new_k_off = 0, new_v_off = 0;
  if (step) {
    new_k_off = elem_distance(static_cast<const T*>(a.new_k.data) + gpu::row_base(a.new_k, b, si.tok_q, hk), kg);
    new_v_off = elem_distance(static_cast<const T*>(a.new_v.data) + gpu::row_base(a.new_v, b, si.tok_q, hk), vg);
  }
  const auto put_offsets = [&](int x, int64_t pg) {
    const int tok = (t0 + x) * BN + tid;
    longlong2 o;
    if (pg < 0) {
      o.x = kNoKey;
      o.y = kNoKey;
    } else if (tok >= c_new) {
      o.x = new_k_off + int64_t(tok - c_new) * a.new_k.stride_s;
      o.y = new_v_off + int64_t(tok - c_new) * a.new_v.stride_s;
    } else {
      const int64_t slot = a.div_ps.mod(tok);
      o.x = pg * p.k.stride_b + slot * p.k.stride_s + int64_t(hk) * p.k.stride_h;
      o.y = pg * p.v.stride_b + slot * p.v.stride_s + int64_t(hk) * p.v.stride_h;
    }
    off_s[(x % S) * BN + tid] = o;
  };
  // cp.async of tile x into stage x % S; keys past the cache and head-dim
  // chunks past d are zero-filled (no NaN from stale memory reaches P.V).
  // A thread copies one 16-byte chunk column cc of rows r_first, r_first + kRowStep, ...
  // (kThreads is a multiple of CH), so the column's bounds and base pointers are set once:
  // the copies of a tile were about half of a warp's instructions at batch 1.
  static_assert(kThreads % CH == 0 && BN % (kThreads / CH) == 0, "a thread's chunk column is fixed");
  constexpr int kRowStep = kThreads / CH;
  const int cc = tid % CH, r_first = tid / CH;
  const bool k_col = cc * 8 < dqk, v_col = cc * 8 < dv;
  const T* kg_c = kg + cc * 8;
  const T* vg_c = vg + cc * 8;
  // A batch's row offsets are read from shared memory before any of its copies is issued: the
  // copies are volatile asm, which the compiler does not move loads across, so reading each row's
  // offsets just before its copies made every row wait a shared-memory round trip (SASS: LDS.128,
  // compare, LDGSTS, eight times a tile). Batches of kRowBatch rows bound the registers held.
  constexpr int kRows = BN / kRowStep, kRowBatch = kRows < 4 ? kRows : 4;
  static_assert(kRows % kRowBatch == 0, "whole batches of rows");
  const auto issue = [&](int x) {
    const int st = x % S;
    const longlong2* o = off_s + st * BN;
    const uint32_t kb = smem_u32(k_s + st * C::kStageBytes), vb = smem_u32(v_s + st * C::kStageBytes);
#pragma unroll
    for (int k0 = 0; k0 < kRows; k0 += kRowBatch) {
      longlong2 ov[kRowBatch];
#pragma unroll
      for (int k = 0; k < kRowBatch; ++k) ov[k] = o[r_first + (k0 + k) * kRowStep];
#pragma unroll
      for (int k = 0; k < kRowBatch; ++k) {
        const int r = r_first + (k0 + k) * kRowStep;
        const uint32_t so = swz<RB>(r, cc);
        const bool kin = k_col && ov[k].x != kNoKey, vin = v_col && ov[k].y != kNoKey;
        cp_async16_l2(kb + so, kin ? kg_c + ov[k].x : kg, kin ? 16 : 0);
        cp_async16_l2(vb + so, vin ? vg_c + ov[k].y : vg, vin ? 16 : 0);
      }
    }
  };

  // ---- prologue: offsets of tiles 0..S-1, Q and tiles 0..S-2 in flight ----
  // The page-table reads of tiles 0..S are independent: they are issued back to back (predicated,
  // no branch between them), and only then clamped and turned into offsets. Written as
  // put_offsets(x, page_of(x)) per tile, each read sat behind the previous tile's clamp and offsets:
  // S + 1 dependent round trips ahead of the first copy.
  bool next_live = false;  // tile x + S's key tid (the loop's next put_offsets): in the cache, entry
  int32_t next_entry = 0;
  if (tid < BN) {
    bool live[S + 1];
    int32_t entry[S + 1];
#pragma unroll
    for (int x = 0; x <= S; ++x) {
      live[x] = key_live(x);
      entry[x] = entry_of(x, live[x]);
    }
#pragma unroll
    for (int x = 0; x < S; ++x)
      if (x < n) put_offsets(x, live[x] ? clamp_page(entry[x]) : -1);
    next_live = live[S];
    next_entry = entry[S];
  }
  __syncthreads();
  const uint32_t qb = smem_u32(q_s);
  for (int u = tid; u < M * CH; u += kThreads) {
    const int lr = u / CH, c = u % CH;
    const int r = row0 + lr, i = static_cast<int>(a.div_group.div(r));
    const bool in = r < a.rows && i < si.len_q && c * 8 < dqk;
    const T* src =
        in ? qg + gpu::row_base(p.q, b, si.tok_q + i, hk * group + static_cast<int>(a.div_group.mod(r))) + c * 8 : qg;
    cp_async16_l2(qb + swz<RB>(lr, c), src, in ? 16 : 0);
  }
#pragma unroll
  for (int x = 0; x < S - 1; ++x) {
    if (x < n) issue(x);
    cp_async_commit();
  }
  if (step) {
    const int chunk = static_cast<int>(a.div_hkv.div(blockIdx.y));
    const int owners = a.splits * static_cast<int>(a.div_hkv.div(gridDim.y));
    write_new_tokens<T>(p, a, si, b, hk, cached_raw, chunk * a.splits + split, owners);
  }

  // The thread's two rows (fragment rows g and g + 8 of its warp's tile): their key ranges and
  // ALiBi slopes are first needed by the first tile's math, so they are worked out here, after the
  // first copies are in flight, not on the path from cu_seqlens to them.
  int ri[2], rlo[2], rhi[2];
  float slope[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = row0 + wm * 16 + g + 8 * rr;
    const int i = static_cast<int>(a.div_group.div(r));
    ri[rr] = i;
    rlo[rr] = 0;
    rhi[rr] = 0;
    slope[rr] = 0.f;
    if (r < a.rows && i < si.len_q) {
      const gpu::KeyRange kr = gpu::key_range(si, i);
      rlo[rr] = kr.lo;
      rhi[rr] = kr.hi;
      if (p.bias.type == BiasType::kAlibi) {
        const int h = hk * group + static_cast<int>(a.div_group.mod(r));
        slope[rr] = p.bias.alibi_slopes[b * p.bias.alibi_stride_b + h * p.bias.alibi_stride_h] * kLog2e;
      }
    }
  }
  const bool has_alibi = p.bias.type == BiasType::kAlibi;
  const int klo = max(rlo[0], rlo[1]), khi = min(rhi[0], rhi[1]);

  float o[D / 8][4];
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  // ldmatrix addresses: Q rows of the warp; K rows as the B operand of Q K^T
  // (matrices: keys 0-7 / 8-15 x d chunks lo / hi); V rows transposed as the
  // B operand of P V (keys 0-7 / 8-15 x d chunks lo / hi).
  const SwzRows<RB> q_addr(qb, wm * 16 + (lane & 15), lane >> 4);
  const SwzRows<RB> k_addr(smem_u32(k_s), ((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1);
  const SwzRows<RB> v_addr(smem_u32(v_s), (((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);

  for (int x = 0; x < n; ++x) {
    cp_async_wait<S - 2>();
    __syncthreads();  // tile x landed; every warp is done with tile x - 1's stage and offsets
    if (x + S - 1 < n) issue(x + S - 1);
    cp_async_commit();
    if (tid < BN) {
      // slot (x + S) % S == x % S: tile x was issued long ago
      if (x + S < n) put_offsets(x + S, next_live ? clamp_page(next_entry) : -1);
      next_live = key_live(x + S + 1);
      next_entry = entry_of(x + S + 1, next_live);
    }

    const uint32_t stage_off = (x % S) * static_cast<uint32_t>(C::kStageBytes);

    // The warp's KW keys of the tile, KS at a time (a rolled loop at d=256,
    // where interleaving the sub-blocks would spill).
#pragma unroll(D == 256 ? 1 : KW / KS)
    for (int sb = 0; sb < KW / KS; ++sb) {
      const int kr0 = wn * KW + sb * KS;  // first key of the sub-block in the tile
      const int jw = (t0 + x) * BN + kr0;
      const uint32_t kv_off = stage_off + kr0 * RB;

      // S = Q K^T.
      float s[KS / 8][4];
#pragma unroll
      for (int nt = 0; nt < KS / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
      // k-steps in groups of 4 (one 128-byte line of every row); rolled at
      // d=256, where hoisting all 16 steps' fragments would spill.
#pragma unroll(D == 256 ? 1 : D / 64)
      for (int kq = 0; kq < D / 64; ++kq) {
#pragma unroll
        for (int k4 = 0; k4 < 4; ++k4) {
          uint32_t qa[4];
          ldsm_x4(q_addr.p[k4] + kq * 128, qa);
#pragma unroll
          for (int nj = 0; nj < KS / 16; ++nj) {
            uint32_t kf[4];
            ldsm_x4(k_addr.p[k4] + kq * 128 + kv_off + nj * 16 * RB, kf);
            mma<T>(s[2 * nj], qa, kf[0], kf[1]);
            mma<T>(s[2 * nj + 1], qa, kf[2], kf[3]);
          }
        }
      }

      // Logits in log2 units; invisible keys -inf.
      const bool full = jw >= klo && jw + KS <= khi;
#pragma unroll
      for (int nt = 0; nt < KS / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int rr = e >> 1;
          const int j = jw + nt * 8 + 2 * t4 + (e & 1);
          float xv = s[nt][e] * a.scale_log2;
          if (has_alibi) xv -= slope[rr] * static_cast<float>(si.vis.alibi_distance(ri[rr], j));
          if (!full && !(j >= rlo[rr] && j < rhi[rr])) xv = -INFINITY;
          s[nt][e] = xv;
        }

      // Online softmax per row (a row's 8 keys of an n-tile sit in one quad).
      float mu[2], alpha[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < KS / 8; ++nt) mx = max_nan(mx, max_nan(s[nt][2 * rr], s[nt][2 * rr + 1]));
        mx = max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = max_nan(m[rr], mx);
        mu[rr] = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: p = 0 below
        alpha[rr] = exp2f(m[rr] - mu[rr]);
        m[rr] = m_new;
        l[rr] *= alpha[rr];
      }
      // O is rescaled only when some row's running max moved in this warp: otherwise every alpha
      // is exp2(0) = 1 exactly and skipping the D / 2 multiplications by 1 leaves O bitwise the
      // same. After a split's first tiles the max rarely moves, and this is a quarter of the
      // warp's per-tile instructions at M = 16.
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
          o[nt][0] *= alpha[0];
          o[nt][1] *= alpha[0];
          o[nt][2] *= alpha[1];
          o[nt][3] *= alpha[1];
        }
      }
#pragma unroll
      for (int nt = 0; nt < KS / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float pv = exp2f(s[nt][e] - mu[e >> 1]);
          l[e >> 1] += pv;
          s[nt][e] = pv;
        }

      // O += P V: the S accumulators of keys 16nj..16nj+15 are the A fragment.
#pragma unroll
      for (int nj = 0; nj < KS / 16; ++nj) {
        const uint32_t pa[4] = {pack2<T>(s[2 * nj][0], s[2 * nj][1]), pack2<T>(s[2 * nj][2], s[2 * nj][3]),
                                pack2<T>(s[2 * nj + 1][0], s[2 * nj + 1][1]),
                                pack2<T>(s[2 * nj + 1][2], s[2 * nj + 1][3])};
#pragma unroll
        for (int dn = 0; dn < D / 16; ++dn) {
          uint32_t vf[4];
          ldsm_x4_t(v_addr.at(dn) + kv_off + nj * 16 * RB, vf);
          mma<T>(o[2 * dn], pa, vf[0], vf[1]);
          mma<T>(o[2 * dn + 1], pa, vf[2], vf[3]);
        }
      }
    }
  }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Every key of the block is read: a combine launched as a programmatic dependent
  // (KernelArgs::pdl, run.cu) may start launching once every block is here, so that its
  // launch overlaps the blocks' epilogues (it waits for this grid's completion before reading the
  // partials). Without such a dependent this does nothing.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  // ---- merge the warps' softmax states (same rows, different keys) ----
  const int lr0 = wm * 16 + g;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
    if (t4 == 0) {
      red_m[wn][lr0 + 8 * rr] = m[rr];
      red_l[wn][lr0 + 8 * rr] = l[rr];
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // stage buffers free for o_s; red_* complete
  float f[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int lr = lr0 + 8 * rr;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < WN; ++w) mx = max_nan(mx, red_m[w][lr]);
    const float mu = mx == -INFINITY ? 0.f : mx;
    f[rr] = exp2f(m[rr] - mu);
    if (wn == 0 && t4 == 0) {
      float L = 0.f;
#pragma unroll
      for (int w = 0; w < WN; ++w) L += red_l[w][lr] * exp2f(red_m[w][lr] - mu);
      row_m[lr] = mx;
      row_l[lr] = L;
    }
  }
#pragma unroll
  for (int nt = 0; nt < D / 8; ++nt) {
    const int col = nt * 8 + 2 * t4;
    *reinterpret_cast<float2*>(o_s + (wn * M + lr0) * OS + col) = make_float2(o[nt][0] * f[0], o[nt][1] * f[0]);
    *reinterpret_cast<float2*>(o_s + (wn * M + lr0 + 8) * OS + col) = make_float2(o[nt][2] * f[1], o[nt][3] * f[1]);
  }
  __syncthreads();

  // ---- write: final rows (one split) or partials (several) ----
  const bool split_mode = a.splits > 1;
  const bool q_thd = p.seqlens.q_is_thd;
  T* out = static_cast<T*>(p.out.data);
  const int64_t ws_row0 = ((int64_t(split) * pr.b + b) * h_kv + hk) * a.rows;
  constexpr int C4 = D / 4;
  for (int u = tid; u < M * C4; u += kThreads) {
    const int lr = u / C4, c = (u % C4) * 4;
    const int r = row0 + lr;
    if (c >= dv || r >= a.rows) continue;
    const int i = static_cast<int>(a.div_group.div(r)), h = hk * group + static_cast<int>(a.div_group.mod(r));
    if (i >= si.len_q) {
      // A padded bshd/sbhd row (thd rows past a sequence belong to others).
      if (!split_mode && !q_thd) {
        store4<T>(out + gpu::row_base(p.out, b, i, h), p.out.stride_d, c, a.out_vec, 0.f, 0.f, 0.f, 0.f);
      }
      continue;
    }
    float4 acc = *reinterpret_cast<const float4*>(o_s + lr * OS + c);
#pragma unroll
    for (int w = 1; w < WN; ++w) {
      const float4 x4 = *reinterpret_cast<const float4*>(o_s + (w * M + lr) * OS + c);
      acc.x += x4.x;
      acc.y += x4.y;
      acc.z += x4.z;
      acc.w += x4.w;
    }
    const float L = row_l[lr];
    if (split_mode) {
      const float inv = L != 0.f ? 1.f / L : 0.f;  // NaN for a NaN row
      *reinterpret_cast<float4*>(a.ws_o + (ws_row0 + r) * dv + c) =
          make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    } else {
      float fct, lse;
      finalize_row(p, h, L, row_m[lr], &fct, &lse);
      store4<T>(out + gpu::row_base(p.out, b, si.tok_q + i, h), p.out.stride_d, c, a.out_vec, acc.x * fct,
                acc.y * fct, acc.z * fct, acc.w * fct);
    }
  }
  for (int lr = tid; lr < M; lr += kThreads) {
    const int r = row0 + lr;
    if (r >= a.rows) continue;
    const int i = static_cast<int>(a.div_group.div(r)), h = hk * group + static_cast<int>(a.div_group.mod(r));
    float* lse_row = p.lse + int64_t(b) * p.lse_stride_b + int64_t(h) * p.lse_stride_h;
    if (i >= si.len_q) {
      if (!split_mode && !q_thd) lse_row[int64_t(i) * p.lse_stride_s] = -INFINITY;
      continue;
    }
    const float L = row_l[lr], mx = row_m[lr];
    if (split_mode) {
      a.ws_lse[ws_row0 + r] = L != 0.f ? mx + log2f(L) : -INFINITY;  // a NaN partial stays NaN
    } else {
      float fct, lse;
      finalize_row(p, h, L, mx, &fct, &lse);
      lse_row[(si.tok_q + i) * p.lse_stride_s] = lse;
    }
    if (p.max_logit != nullptr && L != 0.f) gpu::atomic_max_float(p.max_logit + h, mx * kLn2);
  }

}

// ---- launchers ------------------------------------------------------------------

template <class T, int D, int WM>
Status launch_variant(const FwdParams& p, const DecodeSchedule& plan, const KernelArgs& a, cudaStream_t stream) {
  using C = Tile<D, WM>;
  const auto kernel = decode_kernel<T, D, WM>;
  static std::atomic<uint64_t> smem_ready{0};
  FUSEDATTN_RETURN_IF_ERROR(gpu::prepare_smem(kernel, C::kSmemBytes, "decode", &smem_ready));
  const dim3 grid(static_cast<unsigned>(plan.splits), static_cast<unsigned>(p.prob.h_kv * plan.chunks),
                  static_cast<unsigned>(p.prob.b));
  if (!a.pdl_main || !built_with_dependency_wait()) {
    kernel<<<grid, kThreads, C::kSmemBytes, stream>>>(p, a);
    return gpu::check_launch("decode kernel");
  }
  launch_programmatic(kernel, grid, dim3(kThreads), C::kSmemBytes, stream, p, a);
  return gpu::check_launch("decode kernel (programmatic launch)");
}

template <class T, int D>
Status launch_decode(const FwdParams& p, const DecodeSchedule& plan, const KernelArgs& a, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (plan.row_warps) {
    case 1: return launch_variant<T, D, 1>(p, plan, a, st);
    case 2: return launch_variant<T, D, 2>(p, plan, a, st);
    default: return launch_variant<T, D, 4>(p, plan, a, st);
  }
}

}  // namespace decode
}  // namespace fusedattn
