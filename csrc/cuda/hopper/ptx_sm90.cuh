// Thin PTX wrappers for the Hopper (sm_90a) kernels: mbarrier, TMA (cp.async.bulk.tensor), wgmma
// fences, setmaxnreg, named barriers, the shared-memory matrix descriptor and 16-bit packing.
// Written against the PTX ISA 8.x text; no CUTLASS/CuTe.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "common/ptx.cuh"  // smem_u32, fast_exp2

namespace fusedattn {
namespace hopper {

using gpu::fast_exp2;  // ex2.approx(-inf) = +0, which the masked-out logits rely on
using gpu::smem_u32;

// ---------------------------------------------------------------- mbarrier
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Make the initialised barriers visible to the other threads and to the async
// (TMA) proxy before anyone uses them.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Block until the phase with the given parity has completed. On a freshly initialised barrier
// (current phase 0) waiting for parity 1 returns at once. Watchdog, so that a pipeline bug (phase /
// expect_tx mismatch) cannot hang the GPU: after 2^26 failed polls (each a try_wait, which may
// itself suspend briefly: a second or more in all; legitimate waits are microseconds)
//   TRAP = true : the thread traps -> "unspecified launch failure";
//   TRAP = false: the wait gives up and returns false; the caller carries on with stale shared
//                 memory so that the CTA still ends, and reports it there (timeout_vote: the
//                 consumers' form, whose code must hold no trap).
template <bool TRAP>
__device__ __forceinline__ bool mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t polls = 0;
  while (!mbar_try_wait(bar, parity)) {
    if (++polls == (1u << 26)) {
      if (TRAP) __trap();
      return false;
    }
  }
  return true;
}

// --------------------------------------------------------------------- TMA
__device__ __forceinline__ void tma_prefetch_desc(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

// 4D tiled load, completion signalled on `bar` through complete_tx (bytes).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* tmap, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// ---- tensor maps built on the device (varlen.cuh: one map per sequence) ----
// A map in shared memory (128-byte aligned) rebased: its global address, and the extent of its dim
// 2 (the sequence dim of the (d, h, s, b) maps).
__device__ __forceinline__ void tensormap_rebase_smem(uint32_t smap, const void* addr, uint32_t dim2) {
  asm volatile("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [%0], %1;\n" ::"r"(smap),
               "l"(reinterpret_cast<uint64_t>(addr))
               : "memory");
  asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], 2, %1;\n" ::"r"(smap), "r"(dim2)
               : "memory");
}
// A warp's 128-byte map from shared to global memory for later kernels' TMA (every lane, the same
// addresses): each lane stores 4 bytes, then a tensor-map proxy release at gpu scope (tensormap_acquire
// on the reading side). Plain stores rather than tensormap.cp_fenceproxy, which compute-sanitizer's
// initcheck reports as a read of the uninitialised destination.
__device__ __forceinline__ void tensormap_publish(void* gmap, uint32_t smap) {
  const uint32_t lane = threadIdx.x & 31u;
  uint32_t word;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(word) : "r"(smap + 4u * lane) : "memory");
  static_cast<uint32_t*>(gmap)[lane] = word;
  asm volatile("fence.proxy.tensormap::generic.release.gpu;\n" ::: "memory");
}
// Before a thread's first TMA through a map another kernel wrote: the tensor-map proxy is not acquired
// at kernel start.
__device__ __forceinline__ void tensormap_acquire(const void* gmap) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(gmap))
               : "memory");
}

// ------------------------------------------------------------------- wgmma
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pin a register operand so the compiler cannot move its producers/consumers
// across the fence / wait (same idea as CUTLASS's warpgroup_fence_operand).
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void reg_fence(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// ------------------------------------------------------------------ ldmatrix
// Four 8x8 16-bit matrices; lane l gives the address of row l % 8 of matrix l / 8, and r[i] is
// this lane's pair of matrix i (row lane / 4, columns 2 (lane % 4) and + 1): for a 16 x 16 tile
// whose matrices are ordered (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
// (rows 8-15, k 8-15) that is the A fragment of an m16k16 (and wgmma RS) operand.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t saddr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(saddr)
               : "memory");
}

// ---------------------------------------------------------------- setmaxnreg
// setmaxnreg moves registers within the CTA's pool, which holds what the launch gave each thread:
// for a kernel that uses it, ptxas takes all that __launch_bounds__(threads, 1) allows, this many
// (168 for 384 threads), so the pool is threads x launch_regs(threads), not the 64K register file.
// A setmaxnreg.inc past the pool never returns (ptxas emits a retry loop around the allocation).
constexpr int launch_regs(int threads) { return 65536 / threads / 8 * 8; }
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

// ------------------------------------------------- shared-memory descriptor
// sm_90 wgmma matrix descriptor:
//   bits  0-13 start address >> 4
//   bits 16-29 leading-dimension byte offset >> 4
//   bits 32-45 stride-dimension byte offset >> 4
//   bits 49-51 base offset (0: every swizzle atom starts 1024-byte aligned)
//   bits 62-63 swizzle: 1 = 128B, 2 = 64B, 3 = 32B, 0 = none
// All tiles here use the 128B swizzle produced by TMA with
// CU_TENSOR_MAP_SWIZZLE_128B on a box whose inner extent is 128 bytes
// (64 x 16-bit): row r of a [rows][64] chunk sits at r*128 bytes and its
// 16-byte unit u at unit (u ^ (r % 8)).
//  * K-major operand (Q as A, K as B): SBO = 1024 (next 8 rows), LBO unused (1).
//    A k16 step inside the 64-element chunk advances the start address by 32 B.
//  * MN-major operand (V as B, trans-b = 1): canonical layout
//    ((8,8,m),(8,k)) : ((1,8,LBO),(64,SBO)) in elements, i.e.
//    LBO = byte distance between 64-wide MN chunks, SBO = 1024 (next 8 K rows).
__device__ __forceinline__ uint64_t make_smem_desc(uint32_t saddr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
  d |= static_cast<uint64_t>(1) << 62;  // 128B swizzle
  return d;
}

// ------------------------------------------------------------------- math
template <bool F16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (F16) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Plain (non-tensor) bulk copy global -> shared, completing on an mbarrier
// with complete_tx like the tensor loads (the backward's per-row lse / D slices).
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
      : "memory");
}

// Generic-proxy shared-memory writes (st.shared, stmatrix) become visible to
// wgmma / TMA reads, which use the async proxy.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Barrier `id` (1-15; 0 is __syncthreads) among `nthreads` threads (a multiple
// of 32): synchronises a subset of the CTA, e.g. the consumer warpgroups.
__device__ __forceinline__ void named_bar_sync(uint32_t id, uint32_t nthreads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}

// bar.sync / bar.arrive with an immediate barrier id and thread count (a multiple of 32), for
// barriers that order warpgroups against each other (a ping-pong's turns, a producer-consumer
// handoff between consumer warpgroups: the arriving side does not wait). All threads of each
// participating warp must execute them (aligned). An immediate id lets ptxas count the barriers
// the kernel uses (a register id makes it reserve all 16).
template <int ID, int NTHREADS>
__device__ __forceinline__ void bar_sync_imm() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(NTHREADS) : "memory");
}
template <int ID, int NTHREADS>
__device__ __forceinline__ void bar_arrive_imm() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(NTHREADS) : "memory");
}
// bar.red.or: a vote across warps. True in every one of the NTHREADS threads iff pred is true in
// any of them; synchronises them like bar.sync (aligned, same rules).
template <int ID, int NTHREADS>
__device__ __forceinline__ bool bar_red_or_imm(bool pred) {
  uint32_t any;
  asm volatile(
      "{\n"
      ".reg .pred p, q;\n"
      "setp.ne.u32 q, %1, 0;\n"
      "bar.red.or.pred p, %2, %3, q;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(pred)), "n"(ID), "n"(NTHREADS)
      : "memory");
  return any != 0;
}

// A consumer's wait that gave up (mbar_wait<false>, the backward's dQ turn wait) must fail the
// launch, but a trap reachable from the consumer warpgroups' code makes ptxas spill them (it then
// allocates them as if setmaxnreg had not raised their budget). So at the end of the CTA every
// consumer thread votes whether it gave up (timeout_vote) on barrier ID with the producer
// warpgroup's first warp (NTHREADS: the consumers' threads + 32), and that warp traps
// (timeout_trap): the launch fails, never returning numbers read from stale shared memory.
template <int ID, int NTHREADS>
__device__ __forceinline__ void timeout_vote(bool timed_out) {
  bar_red_or_imm<ID, NTHREADS>(timed_out);
}
template <int ID, int NTHREADS>
__device__ __forceinline__ void timeout_trap() {
  if (bar_red_or_imm<ID, NTHREADS>(false)) __trap();
}

// This thread's warpgroup (threadIdx.x / 128), broadcast from lane 0 so that ptxas knows it is
// warp-uniform: values derived from it (the consumers' shared-memory offsets, hence the wgmma
// descriptors) can then live in uniform registers. Derived from threadIdx.x directly, ptxas treats
// them as per-thread and builds descriptors with vector arithmetic and R2UR moves before the HGMMAs
// (the CUTLASS warp-index idiom).
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
}

// x (the same in every lane) made warp-uniform to ptxas at this point of the program: the volatile
// move keeps it from being hoisted out of an enclosing loop (where ptxas may park a loop invariant
// in a vector register), the lane-0 broadcast marks it uniform: the persistent kernels' shared-memory
// bases per tile, whose wgmma descriptors would otherwise be rebuilt in vector registers.
__device__ __forceinline__ uint32_t warp_uniform_here(uint32_t x) {
  asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
  return __shfl_sync(0xffffffffu, x, 0);
}

// 16-bit pair -> two floats (the inverse of pack2).
template <bool F16>
__device__ __forceinline__ float2 unpack2(uint32_t w) {
  if constexpr (F16) {
    __half2 v;
    memcpy(&v, &w, 4);
    return __half22float2(v);
  } else {
    __nv_bfloat162 v;
    memcpy(&v, &w, 4);
    return __bfloat1622float2(v);
  }
}

// ---- shared -> global tensor reduce (the backward's dQ) ----
// Element-wise reduce-add of a shared-memory box into the global tensor of a
// 4-D tensor map (element type from the map, e.g. f32). Box elements outside
// the tensor bounds are not written. Completes through the bulk async-group of
// the issuing thread: bulk_commit_group, then bulk_wait_group_read<N> before
// the shared source is overwritten (or bulk_wait_group<N> for full completion).
// The generic-proxy writes of the source need fence_proxy_async_smem() by the
// writing threads and a barrier before the issue.
__device__ __forceinline__ void tma_reduce_add_4d(const void* tmap, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(tmap)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// At most N committed bulk groups of this thread still reading shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// At most N committed bulk groups of this thread not yet complete (writes done).
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void st_shared_v2_f32(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// 32-bit shared-memory store / load by shared-space address.
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_shared_b32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// Acquire load / release store at gpu scope (the deterministic backward's dQ turn counters).
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Bidirectional generic <-> async proxy fence for global memory.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

}  // namespace hopper
}  // namespace fusedattn
