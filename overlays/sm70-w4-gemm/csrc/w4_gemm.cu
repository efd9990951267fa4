// SM70 (V100) 4-bit weight GEMMs: fp16 activations x 4-bit weights dequantized in registers,
// WMMA m16n16k16 with fp32 accumulation.  One templated source for every format and both paths.
//
//   Y[t, n] = sum_k X[row(t), k] * W[e(t)][n, k]          (optionally * topk_weight[t])
//
// Weights stay in the checkpoint's layout (no repack, no padding): per expert e a row-major [N, K]
// matrix packed along K, 32 values per 16 bytes:
//   FMT 0  int4 symmetric, compressed-tensors pack-quantized: int32 [N, K/8], nibble j of word i is
//          k = 8i + j (LSB first), value = nibble - 8; scales fp16 [N, ceil(K/group)].
//   FMT 1  int4 asymmetric: the same nibbles, value = nibble - zero; zero points int32 [ceil(N/8), G]
//          packed along N (nibble n % 8 of word [n / 8, g]), as compressed-tensors packs them.
//   FMT 2  NVFP4 (compressed-tensors nvfp4-pack-quantized): uint8 [N, K/2], low nibble = even k,
//          E2M1 (sign, 2 exponent bits, 1 mantissa bit); group scales float8_e4m3fn [N, K/16];
//          value = e2m1 * e4m3 * gscale[e] where gscale = 1 / weight_global_scale (the launcher
//          passes the reciprocal, as vLLM's schemes keep it after loading).
// Volta has no fp8/fp4 hardware: both are decoded by bit manipulation into fp16.
//
// Rows: with sorted_ids (vLLM's moe_align_block_size output, block size BM) block m covers
// sorted_ids[m*BM .. m*BM+BM), all routed to expert_ids[m]; an id t >= num_valid is padding; the
// activation row is t / a_div (top_k for gate_up, whose X is per token; 1 for down, whose X is per
// (token, k) pair); the output row is t, or with out32 (fp32, zeroed by the caller) row t / out_div accumulated
// atomically: split K over gridDim.z (k_split columns of K per block, a multiple of BK) and/or the top-k sum of
// the down projection (out_div = top_k) fused into the epilogue.  Without sorted_ids (linear layers) row t = m*BM + r, expert 0.
// K must be a multiple of 32 (704 = 22 x 32 works without padding: a last partial chunk runs only
// its valid 16-wide steps); any N (rows past N are masked); group sizes >= 16 (16/32/128; NVFP4 is always 16).
#include <cuda_fp16.h>

typedef long long i64;

struct frag_ab { unsigned x[8]; };
struct acc_frag { float x[8]; };

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

__device__ __forceinline__ void mma_row_col(acc_frag& d, const frag_ab& a, const frag_ab& b) {
  asm volatile("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32 {%0,%1,%2,%3,%4,%5,%6,%7},"
               " {%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19,%20,%21,%22,%23},"
               " {%0,%1,%2,%3,%4,%5,%6,%7};"
               : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3]), "+f"(d.x[4]), "+f"(d.x[5]),
                 "+f"(d.x[6]), "+f"(d.x[7])
               : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(a.x[4]), "r"(a.x[5]),
                 "r"(a.x[6]), "r"(a.x[7]), "r"(b.x[0]), "r"(b.x[1]), "r"(b.x[2]), "r"(b.x[3]),
                 "r"(b.x[4]), "r"(b.x[5]), "r"(b.x[6]), "r"(b.x[7]));
}

__device__ __forceinline__ void sstore_acc_row(float* p, const acc_frag& f, int ld) {
  asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.shared.f32 [%0], {%1,%2,%3,%4,%5,%6,%7,%8}, %9;"
               :: "r"(smem_u32(p)), "f"(f.x[0]), "f"(f.x[1]), "f"(f.x[2]), "f"(f.x[3]), "f"(f.x[4]),
                  "f"(f.x[5]), "f"(f.x[6]), "f"(f.x[7]), "r"(ld) : "memory");
}

__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ __half2 u2h2(unsigned v) { return *reinterpret_cast<__half2*>(&v); }
__device__ __forceinline__ unsigned h22u(__half2 v) { return *reinterpret_cast<unsigned*>(&v); }

// Both formats hold 8 values per 32-bit word, nibble i = k offset i.  The dequantizers emit the pairs
// (nibble j, nibble j + 4), j = 0..3, which one mask extracts: shared memory holds every 8-wide k group of the
// weights AND of the activations in the order 0,4,1,5,2,6,3,7 (stage_x8 permutes the activations the same way),
// which leaves every dot product unchanged.
// int4: (n | 0x6400) read as fp16 is 1024 + n, so subtracting 1024 + zero is exact; then times the scale.
__device__ __forceinline__ void deq_int4_word(unsigned w, __half2 sub, __half2 sc, unsigned out[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    unsigned v = ((w >> (4 * j)) & 0x000F000Fu) | 0x64006400u;
    out[j] = h22u(__hmul2(__hsub2(u2h2(v), sub), sc));
  }
}

// E2M1: sign bit 3 -> fp16 bit 15, the three exponent/mantissa bits -> fp16 bits 11..9; that fp16 is
// the value times 2^-14 (subnormals included), so one multiply by 2^14 restores it exactly.
__device__ __forceinline__ void deq_fp4_word(unsigned w, __half2 sc, unsigned out[4]) {
  const __half2 k14 = __float2half2_rn(16384.f);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    unsigned t = w >> (4 * j);
    unsigned v = ((t & 0x00070007u) << 9) | ((t & 0x00080008u) << 12);
    out[j] = h22u(__hmul2(__hmul2(u2h2(v), k14), sc));
  }
}

// Where 8-value group q of 32-value segment s of the flat down kernel's staged activation row starts (halves): groups
// swizzled so the 16-byte reads of a quarter-warp's consecutive segments meet distinct bank groups, the GEMVs'
// swizzle (w4_gemv keeps it inline: written through this helper its measured PTX changes).
__device__ __forceinline__ int seg_x_off(int s, int q) {
  return s * 32 + 8 * (q ^ ((s >> 1) & 3));
}

// 8 activations (k0..k7) -> the order 0,4,1,5,2,6,3,7.
__device__ __forceinline__ uint4 stage_x8(uint4 v) {
  return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632),
                    __byte_perm(v.y, v.w, 0x5410), __byte_perm(v.y, v.w, 0x7632));
}

// E4M3 (bias 7) -> float: the 7 magnitude bits shifted into fp16's exponent/mantissa give the value
// times 2^-8 (subnormals included); NaN (0x7f/0xff) is not produced by quantizers and not handled.
__device__ __forceinline__ float e4m3_to_float(unsigned b) {
  unsigned short h = (unsigned short)(((b & 0x80u) << 8) | ((b & 0x7Fu) << 7));
  return __half2float(*reinterpret_cast<__half*>(&h)) * 256.f;
}

template <int FMT, int BM, int BN, int BK, int WM, int WN, int WK>
struct Cfg {
  static constexpr int NT = 32 * WM * WN * WK;
  static constexpr int LDA = BK + 8;            // padded smem rows (halves)
  static constexpr int FM = BM / WM / 16;       // fragments per warp along M
  static constexpr int FN = BN / WN / 16;       // along N
  static constexpr int KSTEPS = BK / 16;
  static constexpr int W_VECS = BN * BK / 32;   // uint4 of packed weights per chunk
  static constexpr int X_VECS = BM * BK / 8;    // uint4 of fp16 activations per chunk
  static constexpr int WV = (W_VECS + NT - 1) / NT;
  static constexpr int XV = (X_VECS + NT - 1) / NT;
  static constexpr int SMEM_AB = (BM + BN) * LDA * 2;
  static constexpr int SMEM_C = WK * BM * BN * 4;
  static constexpr int SMEM = SMEM_AB > SMEM_C ? SMEM_AB : SMEM_C;
};

template <int FMT, int BM, int BN, int BK, int WM, int WN, int WK, bool DBUF>
__device__ __forceinline__ void w4_gemm(
    half* __restrict__ out, const half* __restrict__ x, const unsigned char* __restrict__ w,
    const void* __restrict__ scales, const int* __restrict__ zeros, const float* __restrict__ gscale,
    const int* __restrict__ sorted_ids, const int* __restrict__ expert_ids, const int* __restrict__ num_post,
    const float* __restrict__ topk_w, int num_valid, int a_div, int N, int K, int group, int ld_x,
    float* __restrict__ out32, int out_div, int k_split) {
  typedef Cfg<FMT, BM, BN, BK, WM, WN, WK> C;
  __shared__ __align__(128) unsigned char smem[C::SMEM];
  half* sx = reinterpret_cast<half*>(smem);
  half* sw = sx + BM * C::LDA;
  float* sc = reinterpret_cast<float*>(smem);
  __shared__ int s_rows[BM];

  const int mb = blockIdx.x, n0 = blockIdx.y * BN;
  // Split K (decode): block z covers [k_begin, k_end) and adds its fp32 partial into out32.
  const int k_begin = blockIdx.z * k_split, k_end = min(K, k_begin + k_split);
  const int tid = threadIdx.x, warp = tid >> 5;
  int e = 0;
  if (sorted_ids) {
    if (mb * BM >= *num_post) return;
    e = expert_ids[mb];
    if (e < 0) return;
  } else if (mb * BM >= num_valid) {
    return;
  }
  for (int r = tid; r < BM; r += C::NT) {
    int t = sorted_ids ? sorted_ids[mb * BM + r] : mb * BM + r;
    s_rows[r] = t < num_valid ? t : -1;
  }
  __syncthreads();

  const int G = (K + group - 1) / group;         // scale groups per row
  const i64 row_bytes = (i64)K / 2;
  const unsigned char* we = w + (i64)e * N * row_bytes;   // scales: [E, N, G]; zero points: [E, ceil(N/8), G]
  const float gs = FMT == 2 ? gscale[e] : 1.f;

  const int wk = warp / (WM * WN), wmn = warp % (WM * WN);
  const int wm = wmn / WN, wn = wmn % WN;
  acc_frag acc[C::FM][C::FN];
#pragma unroll
  for (int i = 0; i < C::FM; ++i)
#pragma unroll
    for (int j = 0; j < C::FN; ++j)
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[i][j].x[q] = 0.f;

  // Two register sets: chunk c + 2's global loads are issued while chunk c + 1's are still in flight.
  struct Regs { uint4 w[C::WV], x[C::XV]; unsigned s[C::WV][2], z[C::WV][2]; };
  Regs R0, R1;
  // Issue the global loads of one K chunk into registers (nothing past this block's K range).
  auto fetch = [&](Regs& R, int kc) {
    if (kc >= k_end) return;
#pragma unroll
    for (int i = 0; i < C::WV; ++i) {
      int v = tid + i * C::NT;
      int n = v / (BK / 32), seg = v % (BK / 32);
      int k0 = kc + seg * 32, ng = n0 + n;
      R.w[i] = make_uint4(0, 0, 0, 0);
      R.s[i][0] = R.s[i][1] = 0u;
      R.z[i][0] = R.z[i][1] = 8u;
      if (v < C::W_VECS && ng < N && k0 < K) {
        R.w[i] = ldg_stream(we + ng * row_bytes + k0 / 2);
        // The scales (and zero points) of the two 16-wide halves of this 32-value segment.
        if (FMT == 2) {
          const unsigned short* s16 = reinterpret_cast<const unsigned short*>(
              reinterpret_cast<const unsigned char*>(scales) + ((i64)e * N + ng) * G + k0 / 16);
          unsigned b2 = *s16;
          R.s[i][0] = b2 & 0xFFu;
          R.s[i][1] = b2 >> 8;
        } else {
          const unsigned short* sh = reinterpret_cast<const unsigned short*>(scales) + ((i64)e * N + ng) * G;
          int g0 = k0 / group, g1 = (k0 + 16) / group;
          R.s[i][0] = sh[g0];
          R.s[i][1] = sh[g1];
          if (FMT == 1) {
            const unsigned* zr = reinterpret_cast<const unsigned*>(zeros) + ((i64)e * ((N + 7) / 8) + ng / 8) * G;
            R.z[i][0] = (zr[g0] >> (4 * (ng % 8))) & 0xFu;
            R.z[i][1] = (zr[g1] >> (4 * (ng % 8))) & 0xFu;
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < C::XV; ++i) {
      int v = tid + i * C::NT;
      int r = v / (BK / 8), seg = v % (BK / 8);
      int k0 = kc + seg * 8;
      R.x[i] = make_uint4(0, 0, 0, 0);
      if (v < C::X_VECS && k0 < K) {
        int t = s_rows[r];
        if (t >= 0) R.x[i] = *reinterpret_cast<const uint4*>(x + (i64)(t / a_div) * ld_x + k0);
      }
    }
  };
  // Dequantize the registers into shared memory ([BN][BK] fp16 = the col-major B operand).
  auto stage = [&](const Regs& R, int kc) {
#pragma unroll
    for (int i = 0; i < C::WV; ++i) {
      int v = tid + i * C::NT;
      if (v >= C::W_VECS) break;
      int n = v / (BK / 32), seg = v % (BK / 32);
      int k0 = kc + seg * 32, ng = n0 + n;
      unsigned o[16];
      const unsigned words[4] = {R.w[i].x, R.w[i].y, R.w[i].z, R.w[i].w};
      if (ng < N && k0 < K) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (FMT == 2) {
            __half2 s2 = __float2half2_rn(e4m3_to_float(R.s[i][h]) * gs);
            deq_fp4_word(words[2 * h], s2, o + 8 * h);
            deq_fp4_word(words[2 * h + 1], s2, o + 8 * h + 4);
          } else {
            unsigned short sb = (unsigned short)R.s[i][h];
            __half2 s2 = __half2half2(*reinterpret_cast<__half*>(&sb));
            __half2 sub = __float2half2_rn(1024.f + (float)R.z[i][h]);
            deq_int4_word(words[2 * h], sub, s2, o + 8 * h);
            deq_int4_word(words[2 * h + 1], sub, s2, o + 8 * h + 4);
          }
        }
      } else {
#pragma unroll
        for (int q = 0; q < 16; ++q) o[q] = 0u;
      }
      uint4* dst = reinterpret_cast<uint4*>(sw + n * C::LDA + seg * 32);
#pragma unroll
      for (int q = 0; q < 4; ++q) dst[q] = make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
    }
#pragma unroll
    for (int i = 0; i < C::XV; ++i) {
      int v = tid + i * C::NT;
      if (v >= C::X_VECS) break;
      int r = v / (BK / 8), seg = v % (BK / 8);
      *reinterpret_cast<uint4*>(sx + r * C::LDA + seg * 8) = stage_x8(R.x[i]);
    }
  };

  auto multiply = [&](int kc) {
    const int ksteps = min(C::KSTEPS, (k_end - kc) / 16);
    for (int ks = wk; ks < ksteps; ks += WK) {
      frag_ab a[C::FM], b;
#pragma unroll
      for (int i = 0; i < C::FM; ++i) sload_a_row(a[i], sx + (wm * C::FM + i) * 16 * C::LDA + ks * 16, C::LDA);
#pragma unroll
      for (int j = 0; j < C::FN; ++j) {
        sload_b_col(b, sw + (wn * C::FN + j) * 16 * C::LDA + ks * 16, C::LDA);
#pragma unroll
        for (int i = 0; i < C::FM; ++i) mma_row_col(acc[i][j], a[i], b);
      }
    }
  };

  if constexpr (!DBUF) {             // one register set: fewer registers, more resident blocks
    fetch(R0, k_begin);
    for (int kc = k_begin; kc < k_end; kc += BK) {
      __syncthreads();
      stage(R0, kc);
      __syncthreads();
      fetch(R0, kc + BK);
      multiply(kc);
    }
  } else {
  fetch(R0, k_begin);
  fetch(R1, k_begin + BK);
  for (int kc = k_begin; kc < k_end; kc += 2 * BK) {
    __syncthreads();                 // the previous chunk's fragments are read
    stage(R0, kc);
    __syncthreads();
    fetch(R0, kc + 2 * BK);
    multiply(kc);
    if (kc + BK >= k_end) break;
    __syncthreads();
    stage(R1, kc + BK);
    __syncthreads();
    fetch(R1, kc + 3 * BK);
    multiply(kc + BK);
  }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < C::FM; ++i)
#pragma unroll
    for (int j = 0; j < C::FN; ++j)
      sstore_acc_row(sc + wk * BM * BN + (wm * C::FM + i) * 16 * BN + (wn * C::FN + j) * 16, acc[i][j], BN);
  __syncthreads();
  for (int idx = tid; idx < BM * BN; idx += C::NT) {
    int r = idx / BN, c = idx % BN;
    int t = s_rows[r], n = n0 + c;
    if (t < 0 || n >= N) continue;
    float v = 0.f;
#pragma unroll
    for (int q = 0; q < WK; ++q) v += sc[q * BM * BN + idx];
    if (topk_w) v *= topk_w[t];
    if (out32) atomicAdd(out32 + (i64)(t / out_div) * N + n, v);   // split K and/or the top-k sum
    else out[(i64)t * N + n] = __float2half_rn(v);
  }
}

// Defaults (the fastest candidates of the 2026-12-02 16:33 UTC H200 run, docs/kernels.md): decode 16 x 64 tiles,
// 128-wide K chunks, 8 warps (4 along N x 2 splitting each chunk), capped at 64 registers (4 blocks per SM), two
// register sets; K split over gridDim.z by the launcher so that a few experts still fill the GPU.  Prefill 64 x 128
// tiles, 8 warps of 32 x 32, one register set, capped at 128 registers (2 blocks per SM).
#define W4_ENTRY(NAME, FMT, BM, BN, BK, WM, WN, WK, MINB, DBUF)                                               \
  extern "C" __global__ void __launch_bounds__(32 * WM * WN * WK, MINB) NAME(                           \
      half* out, const half* x, const unsigned char* w, const void* scales, const int* zeros,            \
      const float* gscale, const int* sorted_ids, const int* expert_ids, const int* num_post,          \
      const float* topk_w, int num_valid, int a_div, int N, int K, int group, int ld_x, float* out32,   \
      int out_div, int k_split) {                                                                       \
    w4_gemm<FMT, BM, BN, BK, WM, WN, WK, DBUF>(out, x, w, scales, zeros, gscale, sorted_ids, expert_ids,      \
                                         num_post, topk_w, num_valid, a_div, N, K, group, ld_x, out32,  \
                                         out_div, k_split);                                             \
  }

W4_ENTRY(w4_gemm_int4_decode, 0, 16, 64, 128, 1, 4, 2, 4, true)
W4_ENTRY(w4_gemm_int4zp_decode, 1, 16, 64, 128, 1, 4, 2, 4, true)
W4_ENTRY(w4_gemm_fp4_decode, 2, 16, 64, 128, 1, 4, 2, 4, true)
W4_ENTRY(w4_gemm_int4_prefill, 0, 64, 128, 64, 2, 4, 1, 2, false)
W4_ENTRY(w4_gemm_int4zp_prefill, 1, 64, 128, 64, 2, 4, 1, 2, false)
W4_ENTRY(w4_gemm_fp4_prefill, 2, 64, 128, 64, 2, 4, 1, 2, false)
// Decode tile candidates measured against the one above (benchmarks/kernels_w4.py, bench_variants).
W4_ENTRY(w4_gemm_int4_decode_v2, 0, 16, 64, 128, 1, 4, 2, 4, true)
W4_ENTRY(w4_gemm_fp4_decode_v2, 2, 16, 64, 128, 1, 4, 2, 4, true)
W4_ENTRY(w4_gemm_int4_decode_v3, 0, 16, 32, 256, 1, 2, 4, 4, true)
W4_ENTRY(w4_gemm_fp4_decode_v3, 2, 16, 32, 256, 1, 2, 4, 4, true)
W4_ENTRY(w4_gemm_int4_decode_v4, 0, 16, 16, 512, 1, 1, 8, 2, true)
W4_ENTRY(w4_gemm_fp4_decode_v4, 2, 16, 16, 512, 1, 1, 8, 2, true)
// Prefill with at most 128 registers, so that two 256-thread blocks fit on an SM.
W4_ENTRY(w4_gemm_int4_prefill_p2, 0, 64, 128, 64, 2, 4, 1, 2, true)
W4_ENTRY(w4_gemm_fp4_prefill_p2, 2, 64, 128, 64, 2, 4, 1, 2, true)
// One register set (DBUF false): decode 16 x 64 x 256 with 8 warps (2 along N x 4 along K), and the prefill tile.
W4_ENTRY(w4_gemm_int4_decode_v5, 0, 16, 64, 256, 1, 2, 4, 3, false)
W4_ENTRY(w4_gemm_fp4_decode_v5, 2, 16, 64, 256, 1, 2, 4, 3, false)
W4_ENTRY(w4_gemm_int4_decode_v6, 0, 16, 64, 256, 1, 2, 4, 2, true)
W4_ENTRY(w4_gemm_fp4_decode_v6, 2, 16, 64, 256, 1, 2, 4, 2, true)
W4_ENTRY(w4_gemm_int4_prefill_p3, 0, 64, 128, 64, 2, 4, 1, 2, false)
W4_ENTRY(w4_gemm_fp4_prefill_p3, 2, 64, 128, 64, 2, 4, 1, 2, false)

// ---------------------------------------------------------------------------------------------------------------
// Decode as GEMV (no tensor cores, no shared-memory weight staging).  Each warp streams whole 16-byte vectors (32
// packed values) of CPW weight rows along K: lane l takes the 32-value segments l, l + 32, ... of a KC-wide chunk,
// all CPW x U vectors loaded before the chunk's activations are staged (so the loads are in flight across the
// __syncthreads), dequantized in registers (weights exact in fp16: int4 n - z via 0x6400, E2M1 via its bits x 2^14),
// multiplied with the block's activation rows in half2 over one 8-value word (4 products per fp16 partial), that
// partial converted to fp32 and scaled by its group scale in fp32 (fp32 accumulation per output), reduced across the
// warp with shuffles.  Activations: the block's rows of X, one KC chunk at a time, in shared memory in the order
// 0,4,1,5,2,6,3,7 per 8 (as stage_x8) with the four 16-byte quads of each segment XOR-swizzled by (seg >> 1) & 3,
// so that the lanes' 16-byte reads are free of bank conflicts.
//   rows: the alignment block mb holds sorted_ids[mb*bm .. mb*bm+bm) (bm at run time, the launcher's block size);
//   its valid rows are compacted and processed BMAX at a time (a block with more valid rows re-streams its weights);
//   without sorted_ids rows mb*bm .. mb*bm+bm of the linear layer.
//   FUSE (gate_up of the MoE): N = 2I weight rows; warp column c < CPW/2 is gate row n, c >= CPW/2 up row n + I, and
//   the epilogue writes act(fp16(gate)) * fp16(up) as fp16 into out [rows, I] (act 1 silu, 2 erf gelu, 3 tanh gelu).
//   Otherwise out[t, n] fp16, or with out32 the fp32 atomics of the down projection (topk_w, t / out_div) as above.
// One 8-value word (int32) of weights holds k offsets 0..7; pair j of the dequantizers = (offset j, offset j + 4).

// E2M1 pair j of a word: magnitude bits of nibble j (and j + 4) into fp16 bits 9..11 (and 25..27), sign bit into 15
// (and 31), each by one shift of the word (no shift of a shifted value, so no bit of nibble j + 4 is lost).
template <int J>
__device__ __forceinline__ unsigned fp4_pair_bits(unsigned w) {
  unsigned mag;
  if constexpr (J < 3) mag = w << (9 - 4 * J);
  else mag = w >> 3;
  const unsigned sgn = w << (12 - 4 * J);
  return (mag & 0x0E000E00u) | (sgn & 0x80008000u);
}

template <int FMT>
__device__ __forceinline__ void gemv_deq_word(unsigned w, __half2 sub, unsigned out[4]) {
  if (FMT == 2) {
    const __half2 k14 = __float2half2_rn(16384.f);
    out[0] = h22u(__hmul2(u2h2(fp4_pair_bits<0>(w)), k14));
    out[1] = h22u(__hmul2(u2h2(fp4_pair_bits<1>(w)), k14));
    out[2] = h22u(__hmul2(u2h2(fp4_pair_bits<2>(w)), k14));
    out[3] = h22u(__hmul2(u2h2(fp4_pair_bits<3>(w)), k14));
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = h22u(__hsub2(u2h2(((w >> (4 * j)) & 0x000F000Fu) | 0x64006400u), sub));
  }
}

__device__ __forceinline__ float gemv_act(float g, int act) {
  if (act == 1) return g / (1.f + __expf(-g));
  if (act == 2) return 0.5f * g * (1.f + erff(g * 0.70710678118654752f));
  return 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

// acc += sum over one 8-value word of (activation pairs xs) x (dequantized pairs d), 4 products per fp16 partial,
// the partial times the word's group scale in fp32.
__device__ __forceinline__ float word_dot(const uint4& xw, const unsigned* d, float s, float acc) {
  __half2 h = __hmul2(u2h2(xw.x), u2h2(d[0]));
  h = __hfma2(u2h2(xw.y), u2h2(d[1]), h);
  h = __hfma2(u2h2(xw.z), u2h2(d[2]), h);
  h = __hfma2(u2h2(xw.w), u2h2(d[3]), h);
  const float2 f = __half22float2(h);
  return fmaf(f.x + f.y, s, acc);
}

// The group scales (fp32) and int4 subtrahends (1024 + zero point, as fp16x2; untouched for FMT 0 and 2) of the two
// 16-value halves of the 32-value segment at k0 of weight row n of expert e (groups g0, g1).  fp4 scales are times
// `mul` (the global scale, and the routing weight where the caller folds it in); int4 ones only with MUL_INT4.
template <int FMT, bool MUL_INT4>
__device__ __forceinline__ void seg_scales(const void* __restrict__ scales, const int* __restrict__ zeros, int e,
                                           int N, int n, int G, int k0, int g0, int g1, float mul, float sc[2],
                                           __half2 sub[2]) {
  if (FMT == 2) {
    const unsigned short b2 = *reinterpret_cast<const unsigned short*>(
        reinterpret_cast<const unsigned char*>(scales) + ((i64)e * N + n) * G + k0 / 16);
    sc[0] = e4m3_to_float(b2 & 0xFFu) * mul;
    sc[1] = e4m3_to_float(b2 >> 8) * mul;
  } else {
    const half* sh = reinterpret_cast<const half*>(scales) + ((i64)e * N + n) * G;
    sc[0] = MUL_INT4 ? __half2float(sh[g0]) * mul : __half2float(sh[g0]);
    sc[1] = MUL_INT4 ? __half2float(sh[g1]) * mul : __half2float(sh[g1]);
    if (FMT == 1) {
      const unsigned* zr = reinterpret_cast<const unsigned*>(zeros) + ((i64)e * ((N + 7) / 8) + n / 8) * G;
      sub[0] = __float2half2_rn(1024.f + (float)((zr[g0] >> (4 * (n % 8))) & 0xFu));
      sub[1] = __float2half2_rn(1024.f + (float)((zr[g1] >> (4 * (n % 8))) & 0xFu));
    }
  }
}

// XR: dequantize one weight row at a time and re-read the activations per row (fewer live registers, so more rows
// per warp fit: the "_c4" entries); otherwise all CPW rows are dequantized first and each activation row read once.
template <int FMT, int NW, int CPW, int KC, int BMAX, bool FUSE, bool XR = false>
__device__ __forceinline__ void w4_gemv(
    half* __restrict__ out, const half* __restrict__ x, const unsigned char* __restrict__ w,
    const void* __restrict__ scales, const int* __restrict__ zeros, const float* __restrict__ gscale,
    const int* __restrict__ sorted_ids, const int* __restrict__ expert_ids, const int* __restrict__ num_post,
    const float* __restrict__ topk_w, int num_valid, int a_div, int N, int K, int group, int ld_x,
    float* __restrict__ out32, int out_div, int act, int bm) {
  static_assert(KC % 1024 == 0, "a chunk is a whole number of 32-lane x 32-value passes");
  static_assert(!FUSE || CPW % 2 == 0, "gate_up fusion pairs gate and up rows in one warp");
  constexpr int U = KC / 1024;                 // segments per lane per chunk
  constexpr int OUTC = FUSE ? CPW / 2 : CPW;   // output columns per warp
  constexpr int MAXBM = 64;
  __shared__ __align__(16) half sx[BMAX * KC];
  __shared__ int s_rows[MAXBM];
  __shared__ int s_n;

  const int mb = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int e = 0;
  if (sorted_ids) {
    const int np = *num_post, eb = expert_ids[mb];   // both loads in flight together (expert_ids has a grid's worth)
    if (mb * bm >= np || eb < 0) return;
    e = eb;
  } else if (mb * bm >= num_valid) {
    return;
  } else if (expert_ids) {
    e = expert_ids[mb];   // routed rows straight from the router (bm = 1): expert_ids is topk_ids, one per block
  }
  // The block's valid rows, compacted in order by warp 0: one load per lane and a ballot (not one load after another).
  if (warp == 0) {
    int n = 0;
    for (int r0 = 0; r0 < bm && r0 < MAXBM; r0 += 32) {
      const int r = r0 + lane;
      int t = num_valid;
      if (r < bm && r < MAXBM) t = sorted_ids ? sorted_ids[mb * bm + r] : mb * bm + r;
      const bool valid = t < num_valid;
      const unsigned m = __ballot_sync(0xffffffffu, valid);
      if (valid) s_rows[n + __popc(m & ((1u << lane) - 1u))] = t;
      n += __popc(m);
    }
    if (lane == 0) s_n = n;
  }
  __syncthreads();
  const int nrows = s_n;

  const int n_out = FUSE ? N / 2 : N;
  const int G = (K + group - 1) / group;
  const int gshift = (group & (group - 1)) == 0 ? __ffs(group) - 1 : -1;
  const i64 row_bytes = (i64)K / 2;
  const unsigned char* we = w + (i64)e * N * row_bytes;
  const float gs = FMT == 2 ? gscale[e] : 1.f;
  int col[CPW];
  bool ok[CPW];
#pragma unroll
  for (int c = 0; c < CPW; ++c) {
    const int oc = (blockIdx.y * NW + warp) * OUTC + (FUSE ? c % OUTC : c);
    ok[c] = oc < n_out;
    col[c] = FUSE && c >= OUTC ? oc + n_out : oc;
  }

  for (int p = 0; p < nrows; p += BMAX) {
    const int nr = min(BMAX, nrows - p);
    float acc[CPW][BMAX];
#pragma unroll
    for (int c = 0; c < CPW; ++c)
#pragma unroll
      for (int r = 0; r < BMAX; ++r) acc[c][r] = 0.f;

    for (int kc = 0; kc < K; kc += KC) {
      const int nseg = min(KC, K - kc) >> 5;
      // This lane's weights of the chunk: U segments x CPW rows, with their two half-segment scales (and zeros).
      uint4 wv[U][CPW];
      float sc[U][CPW][2];
      __half2 sub[U][CPW][2];      // 1024 + zero point, for the 0x6400 trick
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int seg = lane + 32 * u;
        const int k0 = kc + 32 * seg;
        const int g0 = gshift >= 0 ? k0 >> gshift : k0 / group;
        const int g1 = gshift >= 0 ? (k0 + 16) >> gshift : (k0 + 16) / group;
#pragma unroll
        for (int c = 0; c < CPW; ++c) {
          wv[u][c] = make_uint4(0, 0, 0, 0);
          sc[u][c][0] = sc[u][c][1] = 0.f;
          sub[u][c][0] = sub[u][c][1] = __float2half2_rn(1032.f);
          if (seg < nseg && ok[c]) {
            const int n = col[c];
            wv[u][c] = ldg_stream(we + n * row_bytes + k0 / 2);
            seg_scales<FMT, false>(scales, zeros, e, N, n, G, k0, g0, g1, gs, sc[u][c], sub[u][c]);
          }
        }
      }
      __syncthreads();   // the previous chunk's (or row pass's) activations are read
      for (int idx = tid; idx < nr * (KC / 8); idx += NW * 32) {
        const int r = idx / (KC / 8), q8 = idx % (KC / 8);
        const int k = kc + 8 * q8;
        if (k < K) {
          const int seg = q8 >> 2, q = q8 & 3;
          const int t = s_rows[p + r];
          const uint4 v = *reinterpret_cast<const uint4*>(x + (i64)(t / a_div) * ld_x + k);
          *reinterpret_cast<uint4*>(sx + r * KC + seg * 32 + 8 * (q ^ ((seg >> 1) & 3))) = stage_x8(v);
        }
      }
      __syncthreads();
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int seg = lane + 32 * u;
        if (seg >= nseg) break;
        const int sw = (seg >> 1) & 3;
        const half* xseg = sx + seg * 32;
        if constexpr (XR) {
#pragma unroll
          for (int c = 0; c < CPW; ++c) {
            const unsigned words[4] = {wv[u][c].x, wv[u][c].y, wv[u][c].z, wv[u][c].w};
            unsigned dq[16];
#pragma unroll
            for (int q = 0; q < 4; ++q) gemv_deq_word<FMT>(words[q], sub[u][c][q >> 1], dq + 4 * q);
#pragma unroll
            for (int r = 0; r < BMAX; ++r) {
              if (r >= nr) break;
#pragma unroll
              for (int q = 0; q < 4; ++q)
                acc[c][r] = word_dot(*reinterpret_cast<const uint4*>(xseg + r * KC + 8 * (q ^ sw)), dq + 4 * q,
                                     sc[u][c][q >> 1], acc[c][r]);
            }
          }
        } else {
          unsigned dq[CPW][16];
#pragma unroll
          for (int c = 0; c < CPW; ++c) {
            const unsigned words[4] = {wv[u][c].x, wv[u][c].y, wv[u][c].z, wv[u][c].w};
#pragma unroll
            for (int q = 0; q < 4; ++q) gemv_deq_word<FMT>(words[q], sub[u][c][q >> 1], dq[c] + 4 * q);
          }
#pragma unroll
          for (int r = 0; r < BMAX; ++r) {
            if (r >= nr) break;
            uint4 xq[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) xq[q] = *reinterpret_cast<const uint4*>(xseg + r * KC + 8 * (q ^ sw));
#pragma unroll
            for (int c = 0; c < CPW; ++c)
#pragma unroll
              for (int q = 0; q < 4; ++q) acc[c][r] = word_dot(xq[q], dq[c] + 4 * q, sc[u][c][q >> 1], acc[c][r]);
          }
        }
      }
    }

    // Warp sums; lane 0 writes this warp's columns for the pass's rows.
#pragma unroll
    for (int r = 0; r < BMAX; ++r) {
      if (r >= nr) break;
#pragma unroll
      for (int c = 0; c < CPW; ++c) {
        float v = acc[c][r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        acc[c][r] = v;
      }
      if (lane == 0) {
        const int t = s_rows[p + r];
#pragma unroll
        for (int c = 0; c < OUTC; ++c) {
          if (!ok[c]) continue;
          if (FUSE) {
            const float g = __half2float(__float2half_rn(acc[c][r]));
            const float up = __half2float(__float2half_rn(acc[c + OUTC][r]));
            out[(i64)t * n_out + col[c]] = __float2half_rn(gemv_act(g, act) * up);
          } else {
            float v = acc[c][r];
            if (topk_w) v *= topk_w[t];
            if (out32) atomicAdd(out32 + (i64)(t / out_div) * N + col[c], v);
            else out[(i64)t * N + col[c]] = __float2half_rn(v);
          }
        }
      }
    }
  }
}

// 8 warps x CPW weight rows, KC-wide K chunks (BMAX rows of activations: 2 B x BMAX x KC of shared memory), MINB
// blocks per SM (registers capped at 65536 / (256 x MINB): 128 for 2, 80 for 3, 64 for 4).  Default: 2 rows per warp,
// 2048-wide chunks, 8 rows (32 KB), 2 blocks; "_c4": 4 rows per warp (twice the 16-byte loads in flight per lane
// where K is short, e.g. 704), 1024-wide chunks, 4 rows (8 KB), XR, 2 blocks; int4 and fp4 only (int4zp spills at
// 128 registers).  "_q1" / "_r1": 2 rows per warp, 1024- / 2048-wide chunks, ONE activation row per pass, XR, 4
// blocks per SM (60-64 registers: twice the resident warps of the others) -- for blocks of one row, as every expert
// block of a one-token MoE step is (a block of r rows streams its weights r times; the launcher's auto takes them
// up to AUTO_FEW_ROWS routed rows).  "_q4": 4 rows per warp, 1024-wide chunks, one row per pass, XR, 3 blocks per SM
// (80 registers and a 16-40 byte local frame, measured with it): 96 weight rows per SM against q1's 64, so half as
// many 16-byte loads again in flight -- auto's int4 MoE GEMV for few rows.  Per output every GEMV entry runs the same operations in the same order (lane
// segments lane, lane + 32, ... of each row, the same word_dot sequence), so outputs without atomics are bit-equal
// across entries.
#define W4_GEMV_ENTRY(NAME, FMT, FUSE, CPW, KC, BMAX, XR, MINB)                                                \
  extern "C" __global__ void __launch_bounds__(256, MINB) NAME(                                                 \
      half* out, const half* x, const unsigned char* w, const void* scales, const int* zeros,                 \
      const float* gscale, const int* sorted_ids, const int* expert_ids, const int* num_post,               \
      const float* topk_w, int num_valid, int a_div, int N, int K, int group, int ld_x, float* out32,        \
      int out_div, int act, int bm) {                                                                          \
    w4_gemv<FMT, 8, CPW, KC, BMAX, FUSE, XR>(out, x, w, scales, zeros, gscale, sorted_ids, expert_ids, num_post, \
                                      topk_w, num_valid, a_div, N, K, group, ld_x, out32, out_div, act, bm);   \
  }

W4_GEMV_ENTRY(w4_gemv_int4, 0, false, 2, 2048, 8, false, 2)
W4_GEMV_ENTRY(w4_gemv_int4zp, 1, false, 2, 2048, 8, false, 2)
W4_GEMV_ENTRY(w4_gemv_fp4, 2, false, 2, 2048, 8, false, 2)
W4_GEMV_ENTRY(w4_gemv_int4_act, 0, true, 2, 2048, 8, false, 2)
W4_GEMV_ENTRY(w4_gemv_int4zp_act, 1, true, 2, 2048, 8, false, 2)
W4_GEMV_ENTRY(w4_gemv_fp4_act, 2, true, 2, 2048, 8, false, 2)
W4_GEMV_ENTRY(w4_gemv_int4_c4, 0, false, 4, 1024, 4, true, 2)
W4_GEMV_ENTRY(w4_gemv_fp4_c4, 2, false, 4, 1024, 4, true, 2)
W4_GEMV_ENTRY(w4_gemv_int4_act_c4, 0, true, 4, 1024, 4, true, 2)
W4_GEMV_ENTRY(w4_gemv_fp4_act_c4, 2, true, 4, 1024, 4, true, 2)

W4_GEMV_ENTRY(w4_gemv_int4_q1, 0, false, 2, 1024, 1, true, 4)
W4_GEMV_ENTRY(w4_gemv_int4_act_q1, 0, true, 2, 1024, 1, true, 4)
W4_GEMV_ENTRY(w4_gemv_fp4_q1, 2, false, 2, 1024, 1, true, 4)
W4_GEMV_ENTRY(w4_gemv_fp4_act_q1, 2, true, 2, 1024, 1, true, 4)
W4_GEMV_ENTRY(w4_gemv_int4_r1, 0, false, 2, 2048, 1, true, 4)
W4_GEMV_ENTRY(w4_gemv_int4_act_r1, 0, true, 2, 2048, 1, true, 4)
W4_GEMV_ENTRY(w4_gemv_fp4_r1, 2, false, 2, 2048, 1, true, 4)
W4_GEMV_ENTRY(w4_gemv_fp4_act_r1, 2, true, 2, 2048, 1, true, 4)
W4_GEMV_ENTRY(w4_gemv_int4_q4, 0, false, 4, 1024, 1, true, 3)
W4_GEMV_ENTRY(w4_gemv_int4_act_q4, 0, true, 4, 1024, 1, true, 3)
W4_GEMV_ENTRY(w4_gemv_fp4_q4, 2, false, 4, 1024, 1, true, 3)
W4_GEMV_ENTRY(w4_gemv_fp4_act_q4, 2, true, 4, 1024, 1, true, 3)

// ---- The MoE decode's down projection with the top-k sum, straight from the router (w4_moe_down_<fmt>_d<DT>) ----
// out[t, n] = sum over kk < topk of topk_w[t, kk] x sum_k a[t * topk + kk, k] x W[topk_ids[t, kk]][n, k], fp16, in
// one launch: no moe_align_block_size layout, no fp32 buffer to zero, no atomics and no conversion launch, and one
// fixed order of summation (the result does not depend on scheduling).  Block (token t = blockIdx.x, DT output
// columns from blockIdx.y * DT); warp w takes the routed rows kk = w, w + 8, ... of token t; lane l the 32-value K
// segments l, l + 32, ... of each row, keeping for each of the DT columns one fp32 partial (topk_w and the group
// scale folded into each word's scale), the weights of CG columns in flight at a time; a transpose-reduce over the
// warp (DT - 1 shuffles, plus one per halving of 32 / DT) leaves lane c with column c's warp sum; warp 0 adds the
// 8 warps' sums in warp order and writes fp16.  Rows per token up to any top_k (8 warps loop); any K multiple of 32.
// The gate_up of the same decode runs w4_gemv_*_act_* with bm = 1 and expert_ids = topk_ids (no sorted_ids).
// Transpose-reduce over a warp: at offset O each lane keeps the half of its 2 O live partials that its lane bit O
// selects and adds the partner's copy of that half; after offset 1 lane l holds entry l mod (2 O) of the first call.
template <int O>
__device__ __forceinline__ void warp_transpose_reduce(float* p, int lane) {
  if constexpr (O >= 1) {
    const bool hi = (lane & O) != 0;
#pragma unroll
    for (int i = 0; i < O; ++i) {
      const float send = hi ? p[i] : p[i + O];
      const float keep = hi ? p[i + O] : p[i];
      p[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
    warp_transpose_reduce<O / 2>(p, lane);
  }
}

// p[CG] per lane -> lane l's return value is column l mod CG summed over the warp (transpose-reduce, then the
// halves of the warp added).
template <int CG>
__device__ __forceinline__ float warp_column_sums(float* p, int lane) {
  warp_transpose_reduce<CG / 2>(p, lane);
#pragma unroll
  for (int o = CG; o < 32; o <<= 1) p[0] += __shfl_xor_sync(0xffffffffu, p[0], o);
  return p[0];
}

// The block's 8 warp sums of each of its DT columns added in warp order, written as fp16 to out[t, n0 + c].
template <int DT>
__device__ __forceinline__ void down_block_write(const float (*red)[DT], half* __restrict__ out, int t, int N, int n0) {
  __syncthreads();
  for (int c = threadIdx.x; c < DT; c += 256) {
    if (n0 + c >= N) continue;
    float v = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) v += red[i][c];
    out[(i64)t * N + n0 + c] = __float2half_rn(v);
  }
}

// One column group of a down warp: CG weight rows' 16-byte words of one 32-value K segment with their two
// half-segment scales (routing weight folded in) and int4 subtrahends.
template <int FMT, int CG>
struct DownGroup {
  uint4 wv[CG];
  float sc[CG][2];
  __half2 sub[CG][2];
};

// A down warp's routed row j = t * top_k + kk: its expert, its weights and routing weight (times the fp4 global
// scale), with the weight layout's constants; every down kernel loads its column groups through load().
template <int FMT>
struct DownRow {
  const unsigned char* we;
  const void* scales;
  const int* zeros;
  i64 row_bytes;
  float tw;
  int e, N, G, group, gshift;

  __device__ __forceinline__ DownRow(const unsigned char* __restrict__ w, const void* __restrict__ scales_,
                                     const int* __restrict__ zeros_, const float* __restrict__ gscale,
                                     const int* __restrict__ topk_ids, const float* __restrict__ topk_w, i64 j,
                                     int N_, int K, int group_)
      : scales(scales_), zeros(zeros_), row_bytes((i64)K / 2), e(topk_ids[j]), N(N_), G((K + group_ - 1) / group_),
        group(group_), gshift((group_ & (group_ - 1)) == 0 ? __ffs(group_) - 1 : -1) {
    tw = topk_w[j];
    if (FMT == 2) tw *= gscale[e];
    we = w + (i64)e * N * row_bytes;
  }

  // The 32-value segment at k0 with the scale groups of its two halves (a warp that keeps its segment makes it once).
  struct Seg {
    int k0, g0, g1;
  };
  __device__ __forceinline__ Seg seg(int k0) const {
    return {k0, gshift >= 0 ? k0 >> gshift : k0 / group, gshift >= 0 ? (k0 + 16) >> gshift : (k0 + 16) / group};
  }

  // g = columns n0 .. n0 + CG - 1 at segment sg (zeros where !live or past N).
  template <int CG>
  __device__ __forceinline__ void load(DownGroup<FMT, CG>& g, int n0, Seg sg, bool live) const {
#pragma unroll
    for (int c = 0; c < CG; ++c) {
      const int n = n0 + c;
      g.wv[c] = make_uint4(0, 0, 0, 0);
      g.sc[c][0] = g.sc[c][1] = 0.f;
      g.sub[c][0] = g.sub[c][1] = __float2half2_rn(1032.f);
      if (live && n < N) {
        g.wv[c] = ldg_stream(we + n * row_bytes + sg.k0 / 2);
        seg_scales<FMT, true>(scales, zeros, e, N, n, G, sg.k0, sg.g0, sg.g1, tw, g.sc[c], g.sub[c]);
      }
    }
  }
};

// p[c] += the group's column c times the segment's 32 activations xq (order 0,4,1,5,... as stage_x8 leaves them).
template <int FMT, int CG>
__device__ __forceinline__ void down_group_dot(const DownGroup<FMT, CG>& g, const uint4 xq[4], float p[CG]) {
#pragma unroll
  for (int c = 0; c < CG; ++c) {
    const unsigned words[4] = {g.wv[c].x, g.wv[c].y, g.wv[c].z, g.wv[c].w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      unsigned dq[4];
      gemv_deq_word<FMT>(words[q], g.sub[c][q >> 1], dq);
      p[c] = word_dot(xq[q], dq, g.sc[c][q >> 1], p[c]);
    }
  }
}

template <int FMT, int DT, int CG>
__device__ __forceinline__ void w4_moe_down(
    half* __restrict__ out, const half* __restrict__ a, const unsigned char* __restrict__ w,
    const void* __restrict__ scales, const int* __restrict__ zeros, const float* __restrict__ gscale,
    const int* __restrict__ topk_ids, const float* __restrict__ topk_w, int topk, int N, int K, int group, int ld_a) {
  static_assert(CG == 2 || CG == 4 || CG == 8 || CG == 16 || CG == 32, "one column per lane after the reduce");
  static_assert(DT % CG == 0, "whole column groups");
  __shared__ float red[8][DT];
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.y * DT;

#pragma unroll 1
  for (int c0 = 0; c0 < DT; c0 += CG) {
    float p[CG];
#pragma unroll
    for (int c = 0; c < CG; ++c) p[c] = 0.f;
    for (int kk = warp; kk < topk; kk += 8) {
      const i64 j = (i64)t * topk + kk;
      const DownRow<FMT> row(w, scales, zeros, gscale, topk_ids, topk_w, j, N, K, group);
      for (int k0 = 32 * lane; k0 < K; k0 += 1024) {
        DownGroup<FMT, CG> grp;
        row.template load<CG>(grp, n0 + c0, row.seg(k0), true);
        uint4 xq[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) xq[q] = stage_x8(*reinterpret_cast<const uint4*>(a + j * ld_a + k0 + 8 * q));
        down_group_dot<FMT, CG>(grp, xq, p);
      }
    }
    const float v = warp_column_sums<CG>(p, lane);
    if (lane < CG) red[warp][c0 + lane] = v;
  }
  down_block_write<DT>(red, out, t, N, n0);
}

// The same down projection for top_k <= 8 and K <= 1024 (one routed row per warp, one 32-value segment per lane,
// 704 for 26B-A4B), pipelined over the column groups: the next group's weights and scales load before the current
// group is multiplied and reduced, so a warp keeps two groups in flight instead of waiting once per group.
template <int FMT, int DT, int CG>
__device__ __forceinline__ void w4_moe_down_pipe(
    half* __restrict__ out, const half* __restrict__ a, const unsigned char* __restrict__ w,
    const void* __restrict__ scales, const int* __restrict__ zeros, const float* __restrict__ gscale,
    const int* __restrict__ topk_ids, const float* __restrict__ topk_w, int topk, int N, int K, int group, int ld_a) {
  static_assert(DT % CG == 0 && (CG == 2 || CG == 4 || CG == 8), "whole column groups of 2, 4 or 8");
  __shared__ float red[8][DT];
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.y * DT;
  if (warp < topk) {
    const i64 j = (i64)t * topk + warp;
    const DownRow<FMT> row(w, scales, zeros, gscale, topk_ids, topk_w, j, N, K, group);
    const int k0 = 32 * lane;
    const bool live = k0 < K;
    const typename DownRow<FMT>::Seg sg = row.seg(k0);
    uint4 xq[4];
#pragma unroll
    for (int q = 0; q < 4; ++q)
      xq[q] = live ? stage_x8(*reinterpret_cast<const uint4*>(a + j * ld_a + k0 + 8 * q)) : make_uint4(0, 0, 0, 0);
    DownGroup<FMT, CG> cur;
    row.template load<CG>(cur, n0, sg, live);
#pragma unroll 1
    for (int c0 = 0; c0 < DT; c0 += CG) {
      DownGroup<FMT, CG> nxt;
      row.template load<CG>(nxt, n0 + c0 + CG, sg, live && c0 + CG < DT);
      float p[CG];
#pragma unroll
      for (int c = 0; c < CG; ++c) p[c] = 0.f;
      down_group_dot<FMT, CG>(cur, xq, p);
      const float v = warp_column_sums<CG>(p, lane);
      if (lane < CG) red[warp][c0 + lane] = v;
      cur = nxt;
    }
  } else {
    for (int c = lane; c < DT; c += 32) red[warp][c] = 0.f;
  }
  down_block_write<DT>(red, out, t, N, n0);
}

// The same down projection for top_k <= 8 and K <= 1024 with every lane busy ("flat"): the other kernels give lane
// l segment l of a row, so at K = 704 (22 segments) lanes 22-31 idle through every multiply -- a third of the issue
// slots where the decode at 8 tokens is issue-bound.  Here a warp's routed row times its DT columns is DT x S units
// (S = K / 32 segments; 16 x 22 = 352 = 11 passes of 32 at 26B-A4B): in pass p lane l takes unit u = 32 p + l,
// column u / S, segment u % S (consecutive lanes read consecutive 16 bytes of the tile's contiguous weight rows),
// loading pass p + 1's word and scales before it multiplies pass p's.  The activations come from shared memory
// (the warp's row staged once, in stage_x8 order, 8-byte groups swizzled so a quarter-warp's 16-byte reads of
// consecutive segments hit distinct banks); each unit's partial is the same 32-value word_dot chain as the other
// kernels'.  Then the warp's DT x S partials go to shared memory (over its staged row), 32 / DT lanes per column add
// the segments s = i, i + 32 / DT, ... in order and a shuffle finishes; warp 0 adds the 8 warps in warp order.
template <int FMT, int DT>
__device__ __forceinline__ void w4_moe_down_flat(
    half* __restrict__ out, const half* __restrict__ a, const unsigned char* __restrict__ w,
    const void* __restrict__ scales, const int* __restrict__ zeros, const float* __restrict__ gscale,
    const int* __restrict__ topk_ids, const float* __restrict__ topk_w, int topk, int N, int K, int group, int ld_a) {
  static_assert(DT == 8 || DT == 16, "DT columns x at most 32 segments fit one warp's 1024-half row buffer");
  constexpr int KMAX = 1024;
  constexpr int LPC = 32 / DT;                   // lanes per column in the final sum
  __shared__ __align__(16) half xs[8][KMAX];     // the warp's activation row; then its DT x S fp32 partials
  __shared__ float red[8][DT];
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.y * DT;
  const int S = K >> 5, U = DT * S;
  float* part = reinterpret_cast<float*>(xs[warp]);
  if (warp < topk) {
    const i64 j = (i64)t * topk + warp;
    const DownRow<FMT> row(w, scales, zeros, gscale, topk_ids, topk_w, j, N, K, group);
    for (int q8 = lane; q8 < (K >> 3); q8 += 32) {
      const uint4 v = *reinterpret_cast<const uint4*>(a + j * ld_a + 8 * q8);
      *reinterpret_cast<uint4*>(xs[warp] + seg_x_off(q8 >> 2, q8 & 3)) = stage_x8(v);
    }
    __syncwarp();
    // unit u = 32 p + lane as (column c, segment s), advanced by 32 units per pass without a division per pass
    const int cstep = 32 / S, sstep = 32 - cstep * S;
    int c = lane / S, sg = lane - (lane / S) * S;
    DownGroup<FMT, 1> cur;
    row.template load<1>(cur, n0 + c, row.seg(32 * sg), lane < U);
    float acc[DT];
#pragma unroll
    for (int p = 0; p < DT; ++p) {
      acc[p] = 0.f;
      if (32 * p >= U) continue;
      int cn = c + cstep, sn = sg + sstep;
      if (sn >= S) { sn -= S; ++cn; }
      DownGroup<FMT, 1> nxt;
      row.template load<1>(nxt, n0 + cn, row.seg(32 * sn), 32 * (p + 1) + lane < U);
      uint4 xq[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) xq[q] = *reinterpret_cast<const uint4*>(xs[warp] + seg_x_off(sg, q));
      float pp[1] = {0.f};
      down_group_dot<FMT, 1>(cur, xq, pp);
      acc[p] = pp[0];   // units past U (and columns past N) multiply zero weights and scales: 0
      cur = nxt;
      c = cn;
      sg = sn;
    }
    __syncwarp();   // every lane's activation reads are done before the partials overwrite the row
#pragma unroll
    for (int p = 0; p < DT; ++p)
      if (32 * p + lane < U) part[32 * p + lane] = acc[p];
    __syncwarp();
    const int col = lane / LPC, sub = lane % LPC;
    float v = 0.f;
    for (int s2 = sub; s2 < S; s2 += LPC) v += part[col * S + s2];
#pragma unroll
    for (int o = 1; o < LPC; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (sub == 0) red[warp][col] = v;
  } else {
    for (int cc = lane; cc < DT; cc += 32) red[warp][cc] = 0.f;
  }
  down_block_write<DT>(red, out, t, N, n0);
}

// Entries: DT columns per block, CG of them in flight per warp, MINB blocks per SM, PIPE 1 for w4_moe_down_pipe,
// 2 for w4_moe_down_flat (CG 1: one unit per lane and pass).
// d8 / d16: four columns at three blocks (80 registers; fp4 d8: eight at two, 128); n16: two columns at four blocks
// (64 registers); p8 / p16 / q16 the pipelined ones, f8 / f16 the flat ones (four blocks, 16 KB of shared memory
// each).  The launcher's auto runs p8 / p16 where the shape allows (top_k <= 8, K <= 1024), d8 / n16 elsewhere.
#define W4_MOE_DOWN_ENTRY(NAME, FMT, DT, CG, MINB, PIPE)                                                      \
  extern "C" __global__ void __launch_bounds__(256, MINB) NAME(                                                 \
      half* out, const half* a, const unsigned char* w, const void* scales, const int* zeros,                 \
      const float* gscale, const int* topk_ids, const float* topk_w, int topk, int N, int K, int group,       \
      int ld_a) {                                                                                              \
    if constexpr (PIPE == 2)                                                                                   \
      w4_moe_down_flat<FMT, DT>(out, a, w, scales, zeros, gscale, topk_ids, topk_w, topk, N, K, group, ld_a);   \
    else if constexpr (PIPE == 1)                                                                              \
      w4_moe_down_pipe<FMT, DT, CG>(out, a, w, scales, zeros, gscale, topk_ids, topk_w, topk, N, K, group, ld_a); \
    else                                                                                                       \
      w4_moe_down<FMT, DT, CG>(out, a, w, scales, zeros, gscale, topk_ids, topk_w, topk, N, K, group, ld_a);  \
  }

W4_MOE_DOWN_ENTRY(w4_moe_down_int4_d8, 0, 8, 4, 3, 0)
W4_MOE_DOWN_ENTRY(w4_moe_down_fp4_d8, 2, 8, 8, 2, 0)
W4_MOE_DOWN_ENTRY(w4_moe_down_int4_d16, 0, 16, 4, 3, 0)
W4_MOE_DOWN_ENTRY(w4_moe_down_fp4_d16, 2, 16, 4, 3, 0)
W4_MOE_DOWN_ENTRY(w4_moe_down_int4_n16, 0, 16, 2, 4, 0)
W4_MOE_DOWN_ENTRY(w4_moe_down_fp4_n16, 2, 16, 2, 4, 0)
W4_MOE_DOWN_ENTRY(w4_moe_down_int4_p8, 0, 8, 4, 3, 1)
W4_MOE_DOWN_ENTRY(w4_moe_down_fp4_p8, 2, 8, 4, 3, 1)
W4_MOE_DOWN_ENTRY(w4_moe_down_int4_p16, 0, 16, 2, 4, 1)
W4_MOE_DOWN_ENTRY(w4_moe_down_fp4_p16, 2, 16, 2, 4, 1)
W4_MOE_DOWN_ENTRY(w4_moe_down_int4_q16, 0, 16, 4, 3, 1)
W4_MOE_DOWN_ENTRY(w4_moe_down_fp4_q16, 2, 16, 4, 3, 1)
W4_MOE_DOWN_ENTRY(w4_moe_down_int4_f8, 0, 8, 1, 4, 2)
W4_MOE_DOWN_ENTRY(w4_moe_down_fp4_f8, 2, 8, 1, 4, 2)
W4_MOE_DOWN_ENTRY(w4_moe_down_int4_f16, 0, 16, 1, 4, 2)
W4_MOE_DOWN_ENTRY(w4_moe_down_fp4_f16, 2, 16, 1, 4, 2)

// ---- Dequantization to fp16, for prefill through cuBLAS (w4_dequant_<fmt>) ------------------------------------------
// out[e, n, k] = the weight value as fp16 (rounded once from the exact product): int4 (nibble - 8 or - zero) x scale,
// fp4 e2m1 x e4m3 x gscale[e].  One thread per 32 packed values (a 16-byte load, four 16-byte stores); grid
// (ceil(N K / 32 / 256), E).  K a multiple of 32, so a thread's values lie in one row.  A prefill of many rows reads
// the packed weights once, writes N K fp16 values, and runs the fp16 GEMM (tensor cores on sm_70 through cuBLAS)
// on them: the launcher's "dequant" prefill.
template <int FMT>
__device__ __forceinline__ void w4_dequant(half* __restrict__ out, const unsigned char* __restrict__ w,
                                           const void* __restrict__ scales, const int* __restrict__ zeros,
                                           const float* __restrict__ gscale, int N, int K, int group) {
  const int e = blockIdx.y;
  const i64 nvec = (i64)N * (K / 32);
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nvec) return;
  const int n = (int)(i / (K / 32));
  const int k0 = (int)(i % (K / 32)) * 32;
  const int G = (K + group - 1) / group;
  const i64 row = (i64)e * N + n;
  const uint4 v = ldg_stream(w + row * (K / 2) + k0 / 2);
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
  const float gs = FMT == 2 ? gscale[e] : 1.f;
  uint4* dst = reinterpret_cast<uint4*>(out + row * K + k0);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int k = k0 + 8 * q;
    const int g = k / group;
    float s, z = 8.f;
    if (FMT == 2) {
      s = e4m3_to_float(reinterpret_cast<const unsigned char*>(scales)[row * G + g]) * gs;
    } else {
      s = __half2float(reinterpret_cast<const half*>(scales)[row * G + g]);
      if (FMT == 1) {
        const unsigned zr = reinterpret_cast<const unsigned*>(zeros)[((i64)e * ((N + 7) / 8) + n / 8) * G + g];
        z = (float)((zr >> (4 * (n % 8))) & 0xFu);
      }
    }
    unsigned h[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float a, b;
      const unsigned lo = (words[q] >> (8 * j)) & 0xFu, hi = (words[q] >> (8 * j + 4)) & 0xFu;
      if (FMT == 2) {
        const unsigned short ha = (unsigned short)(((lo & 8u) << 12) | ((lo & 7u) << 9));
        const unsigned short hb = (unsigned short)(((hi & 8u) << 12) | ((hi & 7u) << 9));
        a = __half2float(*reinterpret_cast<const half*>(&ha)) * 16384.f;
        b = __half2float(*reinterpret_cast<const half*>(&hb)) * 16384.f;
      } else {
        a = (float)lo - z;
        b = (float)hi - z;
      }
      h[j] = h22u(__floats2half2_rn(a * s, b * s));
    }
    dst[q] = make_uint4(h[0], h[1], h[2], h[3]);
  }
}

#define W4_DEQUANT_ENTRY(NAME, FMT)                                                                          \
  extern "C" __global__ void __launch_bounds__(256) NAME(half* out, const unsigned char* w, const void* scales, \
                                                         const int* zeros, const float* gscale, int N, int K,  \
                                                         int group) {                                          \
    w4_dequant<FMT>(out, w, scales, zeros, gscale, N, K, group);                                             \
  }

W4_DEQUANT_ENTRY(w4_dequant_int4, 0)
W4_DEQUANT_ENTRY(w4_dequant_int4zp, 1)
W4_DEQUANT_ENTRY(w4_dequant_fp4, 2)
