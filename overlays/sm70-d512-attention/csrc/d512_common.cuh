// Shared helpers for the head_dim-512 attention kernels (sm_70 and newer).
//
// Layout conventions (vLLM paged KV cache, one tensor for K and one for V):
//   cache[num_blocks, block_size, num_kv_heads, 512] fp16, addressed through
//   element strides (block, token, head) so that views of a combined
//   (2, num_blocks, ...) tensor work too.  Token t of sequence b lives in
//   physical block block_tables[b * max_blocks + t / block_size], slot
//   t % block_size.
// The kernels use WMMA 16x16x16 fp16 tiles
// with fp32 accumulation.  Shared-memory rows are padded to LDS halves so that
// the column-major and row-major fragment loads do not hit the same banks.
#pragma once
#include <cuda_fp16.h>

#define HD 512                 // head dimension
#define LDS 520                // padded shared-memory row stride (halves)
#define CHUNK 32               // keys per pipeline step
#define VEC_PER_ROW (HD / 8)   // uint4 (8 halves) per row

typedef long long i64;

// ---------------------------------------------------------------------------
// Minimal WMMA m16n16k16 (fp16 x fp16 -> fp32) through PTX, so that only
// cuda_fp16.h is needed (the CUDA-12 wheels ship no crt/mma.h).  The register
// layout of a fragment is opaque, exactly as with nvcuda::wmma; the PTX
// `wmma` instructions exist from sm_70 on.
// ---------------------------------------------------------------------------
struct frag_ab { unsigned x[8]; };            // A or B operand, 8 x f16x2
struct acc_frag {                             // accumulator, 8 x f32
  static constexpr int num_elements = 8;
  float x[8];
};

__device__ __forceinline__ void fill_acc(acc_frag& f, float v) {
#pragma unroll
  for (int i = 0; i < 8; ++i) f.x[i] = v;
}

#define WMMA_LOAD_AB(NAME, OP)                                                                  \
  __device__ __forceinline__ void NAME(frag_ab& f, const half* p, int ld) {                     \
    asm volatile(OP " {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"                                      \
                 : "=r"(f.x[0]), "=r"(f.x[1]), "=r"(f.x[2]), "=r"(f.x[3]), "=r"(f.x[4]),          \
                   "=r"(f.x[5]), "=r"(f.x[6]), "=r"(f.x[7])                                      \
                 : "l"(p), "r"(ld)                                                               \
                 : "memory");                                                                    \
  }
WMMA_LOAD_AB(load_a_row, "wmma.load.a.sync.aligned.row.m16n16k16.f16")
WMMA_LOAD_AB(load_b_col, "wmma.load.b.sync.aligned.col.m16n16k16.f16")
WMMA_LOAD_AB(load_b_row, "wmma.load.b.sync.aligned.row.m16n16k16.f16")

__device__ __forceinline__ void load_acc_row(acc_frag& f, const float* p, int ld) {
  asm volatile("wmma.load.c.sync.aligned.row.m16n16k16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"
               : "=f"(f.x[0]), "=f"(f.x[1]), "=f"(f.x[2]), "=f"(f.x[3]), "=f"(f.x[4]), "=f"(f.x[5]),
                 "=f"(f.x[6]), "=f"(f.x[7])
               : "l"(p), "r"(ld)
               : "memory");
}

__device__ __forceinline__ void store_acc_row(float* p, const acc_frag& f, int ld) {
  asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.f32 [%0], {%1,%2,%3,%4,%5,%6,%7,%8}, %9;"
               :: "l"(p), "f"(f.x[0]), "f"(f.x[1]), "f"(f.x[2]), "f"(f.x[3]), "f"(f.x[4]), "f"(f.x[5]),
                  "f"(f.x[6]), "f"(f.x[7]), "r"(ld) : "memory");
}

#define WMMA_MMA(NAME, OP)                                                                        \
  __device__ __forceinline__ void NAME(acc_frag& d, const frag_ab& a, const frag_ab& b) {         \
    asm volatile(OP " {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11,%12,%13,%14,%15},"                \
                    " {%16,%17,%18,%19,%20,%21,%22,%23}, {%0,%1,%2,%3,%4,%5,%6,%7};"              \
                 : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3]), "+f"(d.x[4]),            \
                   "+f"(d.x[5]), "+f"(d.x[6]), "+f"(d.x[7])                                        \
                 : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(a.x[4]), "r"(a.x[5]),  \
                   "r"(a.x[6]), "r"(a.x[7]), "r"(b.x[0]), "r"(b.x[1]), "r"(b.x[2]), "r"(b.x[3]),  \
                   "r"(b.x[4]), "r"(b.x[5]), "r"(b.x[6]), "r"(b.x[7]));                            \
  }
WMMA_MMA(mma_row_col, "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32")
WMMA_MMA(mma_row_row, "wmma.mma.sync.aligned.row.row.m16n16k16.f32.f32")

// Shared-memory WMMA accesses that name the .shared state space explicitly (32-bit
// shared addresses) instead of generic addresses: the fragment loads are the
// kernels' hottest instructions; this alone made the prefill 12-15 % faster on the
// H200 (compute_70 PTX; docs/kernels.md).  Plain PTX wmma from sm_70 on.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
#define WMMA_LOAD_AB_S(NAME, OP)                                                                \
  __device__ __forceinline__ void NAME(frag_ab& f, const half* p, int ld) {                     \
    asm volatile(OP " {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"                                      \
                 : "=r"(f.x[0]), "=r"(f.x[1]), "=r"(f.x[2]), "=r"(f.x[3]), "=r"(f.x[4]),          \
                   "=r"(f.x[5]), "=r"(f.x[6]), "=r"(f.x[7])                                      \
                 : "r"(smem_u32(p)), "r"(ld)                                                     \
                 : "memory");                                                                    \
  }
WMMA_LOAD_AB_S(sload_a_row, "wmma.load.a.sync.aligned.row.m16n16k16.shared.f16")
WMMA_LOAD_AB_S(sload_b_col, "wmma.load.b.sync.aligned.col.m16n16k16.shared.f16")
WMMA_LOAD_AB_S(sload_b_row, "wmma.load.b.sync.aligned.row.m16n16k16.shared.f16")
// The same with the 32-bit shared address computed by the caller (base once per kernel +
// constant offsets), so that the compiler does not redo 64-bit generic address arithmetic
// and a cvta per fragment.
#define WMMA_LOAD_AB_U(NAME, OP)                                                                \
  __device__ __forceinline__ void NAME(frag_ab& f, unsigned saddr, int ld) {                    \
    asm volatile(OP " {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"                                      \
                 : "=r"(f.x[0]), "=r"(f.x[1]), "=r"(f.x[2]), "=r"(f.x[3]), "=r"(f.x[4]),          \
                   "=r"(f.x[5]), "=r"(f.x[6]), "=r"(f.x[7])                                      \
                 : "r"(saddr), "r"(ld)                                                           \
                 : "memory");                                                                    \
  }
WMMA_LOAD_AB_U(uload_a_row, "wmma.load.a.sync.aligned.row.m16n16k16.shared.f16")
WMMA_LOAD_AB_U(uload_b_col, "wmma.load.b.sync.aligned.col.m16n16k16.shared.f16")
WMMA_LOAD_AB_U(uload_b_row, "wmma.load.b.sync.aligned.row.m16n16k16.shared.f16")
__device__ __forceinline__ void ustore_acc_row(unsigned saddr, const acc_frag& f, int ld) {
  asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.shared.f32 [%0], {%1,%2,%3,%4,%5,%6,%7,%8}, %9;"
               :: "r"(saddr), "f"(f.x[0]), "f"(f.x[1]), "f"(f.x[2]), "f"(f.x[3]), "f"(f.x[4]), "f"(f.x[5]),
                  "f"(f.x[6]), "f"(f.x[7]), "r"(ld) : "memory");
}
__device__ __forceinline__ void sstore_acc_row(float* p, const acc_frag& f, int ld) {
  asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.shared.f32 [%0], {%1,%2,%3,%4,%5,%6,%7,%8}, %9;"
               :: "r"(smem_u32(p)), "f"(f.x[0]), "f"(f.x[1]), "f"(f.x[2]), "f"(f.x[3]), "f"(f.x[4]), "f"(f.x[5]),
                  "f"(f.x[6]), "f"(f.x[7]), "r"(ld) : "memory");
}

// The accumulator layout of a WMMA fragment is opaque.  To rescale rows of a
// running output (online softmax) we learn, once per kernel, which row each
// register of a thread's accumulator fragment holds: load a 16x16 matrix whose
// element (r, c) is r and read the registers back.  `scratch` is 256 floats.
__device__ __forceinline__ void fill_row_index(float* scratch) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) scratch[i] = (float)(i >> 4);
}

// Rows are < 16, so the map packs into one register: 4 bits per element.
__device__ __forceinline__ unsigned learn_row_map(const float* scratch) {
  acc_frag f;
  load_acc_row(f, scratch, 16);
  unsigned packed = 0;
#pragma unroll
  for (int i = 0; i < acc_frag::num_elements; ++i) packed |= ((unsigned)f.x[i] & 15u) << (4 * i);
  return packed;
}

__device__ __forceinline__ int row_of(unsigned packed, int i) { return (packed >> (4 * i)) & 15; }

// Paged-cache addressing for one sequence and one KV head.  Block sizes that
// are powers of two (vLLM uses 16 and 32) take a shift/mask instead of an
// integer division, which would otherwise dominate the load loop.
struct Pager {
  const int* __restrict__ table;  // this sequence's block table row
  int block_size, shift;          // shift = log2(block_size), or -1
  i64 sb, st, head_off;

  __device__ __forceinline__ Pager(const int* __restrict__ block_tables, int b, int max_blocks, int block_size_,
                                   int kvh, i64 sb_, i64 st_, i64 sh)
      : table(block_tables + (i64)b * max_blocks), block_size(block_size_),
        shift((block_size_ & (block_size_ - 1)) == 0 ? __ffs(block_size_) - 1 : -1),
        sb(sb_), st(st_), head_off((i64)kvh * sh) {}

  __device__ __forceinline__ i64 offset(int t) const {
    int blk_idx, slot;
    if (shift >= 0) { blk_idx = t >> shift; slot = t & (block_size - 1); }
    else { blk_idx = t / block_size; slot = t - blk_idx * block_size; }
    return (i64)__ldg(table + blk_idx) * sb + (i64)slot * st + head_off;
  }
};

// A block of NT threads moves a CHUNK x 512 tile as NT-thread passes of
// 16-byte vectors: vector j of thread tid is row tid / VEC_PER_ROW +
// j * (NT / VEC_PER_ROW), column tid % VEC_PER_ROW (coalesced 1 KB rows).
template <int NT> struct Tile {
  static constexpr int VECS = CHUNK * VEC_PER_ROW / NT;   // per thread
  static constexpr int ROWS_PER_PASS = NT / VEC_PER_ROW;
};

// Element offsets of this thread's rows (tokens t0 + row), -1 at or past t_end.
template <int NT>
__device__ __forceinline__ void chunk_offsets(i64 (&off)[Tile<NT>::VECS], const Pager& pg, int t0, int t_end) {
#pragma unroll
  for (int j = 0; j < Tile<NT>::VECS; ++j) {
    const int t = t0 + (int)threadIdx.x / VEC_PER_ROW + j * Tile<NT>::ROWS_PER_PASS;
    off[j] = t < t_end ? pg.offset(t) : -1;
  }
}

template <int NT>
__device__ __forceinline__ void load_chunk(uint4 (&r)[Tile<NT>::VECS], const half* __restrict__ cache,
                                           const i64 (&off)[Tile<NT>::VECS]) {
  const int c = threadIdx.x % VEC_PER_ROW;
#pragma unroll
  for (int j = 0; j < Tile<NT>::VECS; ++j)
    r[j] = off[j] >= 0 ? __ldg(reinterpret_cast<const uint4*>(cache + off[j]) + c) : make_uint4(0u, 0u, 0u, 0u);
}

template <int NT>
__device__ __forceinline__ void store_chunk(half* __restrict__ smem, const uint4 (&r)[Tile<NT>::VECS]) {
  const int row = threadIdx.x / VEC_PER_ROW, c = threadIdx.x % VEC_PER_ROW;
#pragma unroll
  for (int j = 0; j < Tile<NT>::VECS; ++j)
    *reinterpret_cast<uint4*>(smem + (row + j * Tile<NT>::ROWS_PER_PASS) * LDS + c * 8) = r[j];
}

__device__ __forceinline__ float warp_max_width(float v, int width) {
  for (int o = width / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum_width(float v, int width) {
  for (int o = width / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

#define NEG_INF (-__int_as_float(0x7f800000))
#define LOG2E 1.4426950408889634f
