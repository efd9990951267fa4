// Shared helpers for the SM70 attention kernel family (head dims 64, 128, 256, 512; sm_70 and newer).
//
// Layout conventions (vLLM paged KV cache, one tensor for K and one for V):
//   cache[num_blocks, block_size, num_kv_heads, HD] (fp16, or fp8 e4m3 / e5m2 storage),
//   addressed through element strides (block, token, head) so that views of a combined
//   (2, num_blocks, ...) tensor work too.  Token t of sequence b lives in
//   physical block block_tables[b * max_blocks + t / block_size], slot
//   t % block_size.
// The kernels use WMMA 16x16x16 fp16 tiles with fp32 accumulation.  Shared-memory
// rows are padded to HD + 8 halves so that the column-major and row-major fragment
// loads do not hit the same banks.  Everything that depends on the head dimension
// is a template parameter; paged_decode.cu and prefill.cu instantiate one entry
// point per (head dim, KV format).
#pragma once
#include <cuda_fp16.h>

template <int HD> struct Dims {
  static constexpr int LDS = HD + 8;          // padded shared-memory row stride (halves)
  static constexpr int VEC_PER_ROW = HD / 8;  // 8-element vectors per row
};

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

// KV storage formats: FMT 0 = fp16, 1 = fp8 e4m3 (float8_e4m3fn), 2 = fp8 e5m2.  A vector is
// 8 elements (16 bytes of fp16, 8 bytes of fp8), so the thread-to-element mapping is the
// same for every format; fp8 vectors are widened to fp16 when they are stored to shared
// memory.  e5m2 is the top byte of an fp16 (exact).  e4m3 bits (s eeee mmm) placed at
// fp16 bit 7 (s at 15) give an fp16 of exactly value * 2^-8 for normals and subnormals
// alike (the exponent bias differs by 8): the kernels fold FP8_E4M3_UNIT into the
// dequantization scale instead of multiplying every element.
template <int FMT> struct KV;
template <> struct KV<0> {
  typedef uint4 vec;
  static constexpr int ESZ = 2;
  __device__ static __forceinline__ uint4 widen(const uint4& v) { return v; }
  __device__ static __forceinline__ uint4 zero() { return make_uint4(0u, 0u, 0u, 0u); }
};
__device__ __forceinline__ unsigned e4m3x2_to_h2(unsigned w) {  // bytes 0,1 of w -> half2
  return ((w & 0x7Fu) << 7) | ((w & 0x80u) << 8) | ((w & 0x7F00u) << 15) | ((w & 0x8000u) << 16);
}
template <> struct KV<1> {
  typedef uint2 vec;
  static constexpr int ESZ = 1;
  __device__ static __forceinline__ uint4 widen(const uint2& v) {
    return make_uint4(e4m3x2_to_h2(v.x), e4m3x2_to_h2(v.x >> 16), e4m3x2_to_h2(v.y), e4m3x2_to_h2(v.y >> 16));
  }
  __device__ static __forceinline__ uint2 zero() { return make_uint2(0u, 0u); }
};
template <> struct KV<2> {
  typedef uint2 vec;
  static constexpr int ESZ = 1;
  __device__ static __forceinline__ uint4 widen(const uint2& v) {
    return make_uint4(__byte_perm(v.x, 0u, 0x1404), __byte_perm(v.x, 0u, 0x3424), __byte_perm(v.y, 0u, 0x1404),
                      __byte_perm(v.y, 0u, 0x3424));
  }
  __device__ static __forceinline__ uint2 zero() { return make_uint2(0u, 0u); }
};
#define FP8_E4M3_UNIT 256.f   // e4m3 widened as above is value / 256

// Dequantization factor of a KV format: 1 for fp16, the per-tensor scale (vLLM's
// layer._k_scale / _v_scale, read on the device so that CUDA graphs see updates) times
// the widening unit for fp8.
template <int FMT> __device__ __forceinline__ float kv_factor(const float* __restrict__ s) {
  if constexpr (FMT == 0) return 1.f;
  else return (s ? __ldg(s) : 1.f) * (FMT == 1 ? FP8_E4M3_UNIT : 1.f);
}

// A block of NT threads moves a CH x HD tile as NT-thread passes of 8-element
// vectors: vector j of thread tid is row tid / VEC_PER_ROW + j * (NT / VEC_PER_ROW),
// column tid % VEC_PER_ROW (coalesced rows).
template <int NT, int HD, int CH> struct Tile {
  static constexpr int VPR = Dims<HD>::VEC_PER_ROW;
  static constexpr int VECS = CH * VPR / NT;   // per thread
  static constexpr int ROWS_PER_PASS = NT / VPR;
  static_assert(VECS >= 1 && VECS * NT == CH * VPR, "tile: threads must cover the chunk");
};

// Element offsets of this thread's rows (tokens t0 + row), -1 at or past t_end.
template <int NT, int HD, int CH>
__device__ __forceinline__ void chunk_offsets(i64 (&off)[Tile<NT, HD, CH>::VECS], const Pager& pg, int t0, int t_end) {
  typedef Tile<NT, HD, CH> T;
#pragma unroll
  for (int j = 0; j < T::VECS; ++j) {
    const int t = t0 + (int)threadIdx.x / T::VPR + j * T::ROWS_PER_PASS;
    off[j] = t < t_end ? pg.offset(t) : -1;
  }
}

template <int NT, int HD, int CH, int FMT>
__device__ __forceinline__ void load_chunk(typename KV<FMT>::vec (&r)[Tile<NT, HD, CH>::VECS], const void* __restrict__ cache,
                                           const i64 (&off)[Tile<NT, HD, CH>::VECS]) {
  typedef Tile<NT, HD, CH> T;
  typedef typename KV<FMT>::vec V;
  const int c = threadIdx.x % T::VPR;
  const unsigned char* base = reinterpret_cast<const unsigned char*>(cache);
#pragma unroll
  for (int j = 0; j < T::VECS; ++j)
    r[j] = off[j] >= 0 ? __ldg(reinterpret_cast<const V*>(base + off[j] * KV<FMT>::ESZ) + c) : KV<FMT>::zero();
}

template <int NT, int HD, int CH, int FMT>
__device__ __forceinline__ void store_chunk(half* __restrict__ smem, const typename KV<FMT>::vec (&r)[Tile<NT, HD, CH>::VECS]) {
  typedef Tile<NT, HD, CH> T;
  const int row = threadIdx.x / T::VPR, c = threadIdx.x % T::VPR;
#pragma unroll
  for (int j = 0; j < T::VECS; ++j)
    *reinterpret_cast<uint4*>(smem + (row + j * T::ROWS_PER_PASS) * Dims<HD>::LDS + c * 8) = KV<FMT>::widen(r[j]);
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
