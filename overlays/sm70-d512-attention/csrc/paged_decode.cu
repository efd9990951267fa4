// Paged decode attention for head dims 64/128/256/512, fp16 queries and output, fp16 or
// fp8 (e4m3 / e5m2, per-tensor scale) KV cache, fp32 accumulation.
//
// One block = one sequence x one KV head x (up to 16 query heads of that KV
// head's GQA group, packed as the 16 rows of the WMMA tiles) x one split of
// the context.  The key range of the sequence is cut into `num_splits` pieces
// so that a small batch still fills the GPU; split results (unnormalised
// output, running max, running sum) go to a workspace and
// `paged_decode_d<HD>_reduce` merges them.  With num_splits == 1 the kernel
// writes the normalised fp16 output itself.
//
// Pipeline per chunk of DecodeCfg<HD>::CHUNK keys (32 at HD 512, 64 at 256, 128 at
// 128 and 64: the same ~64 KB of fp16 K+V per step): registers -> shared K/V,
// S = Q K^T on tensor cores (chunk column tiles x head-dim parts over the 8 warps),
// online softmax on 256 threads, O = O * alpha + P V on tensor cores; the next
// chunk's global loads are in flight while the current chunk is computed.  fp8
// chunks are loaded as 8-byte vectors (half the registers) and widened to fp16 on
// the way into shared memory; the K scale is folded into the softmax scale and the
// V scale into the final normalisation.
//
// Shared memory (bytes) per head dim (DecodeCfg::SMEM): K and V CHUNK x (HD+8) halves
// each, Q 16 x (HD+8), S partials KQ x 16 x (CHUNK+4) floats, P 16 x (CHUNK+8) halves,
// row stats 192: HD 512 93,888; 256 87,232; 128 86,976; 64 52,160 (< 96 KB, Volta's
// opt-in limit).  HD 512 is the kernel measured in docs/kernels.md, unchanged in its
// arithmetic (the same operations in the same order).
#include "attn_common.cuh"

#define NTHREADS 256
#define QROWS 16
// One block per SM lets the compiler keep the next chunk's K/V (64 registers)
// and the output tiles without spilling.  -DDECODE_MIN_BLOCKS=2 caps registers
// at 128 so that two blocks share an SM where shared memory allows it (sm_80+);
// on an H200 that measured slower at HD 512 (54.6 % vs 60.9 % of peak at batch 32 x 32K).
#ifndef DECODE_MIN_BLOCKS
#define DECODE_MIN_BLOCKS 1
#endif
// Most splits the reduce kernel merges (its shared weight table).
#define MAX_SPLITS 256

template <int HD> struct DecodeCfg {
  static constexpr int CHUNK = HD >= 512 ? 32 : (HD == 256 ? 64 : 128);
  static constexpr int LDS = Dims<HD>::LDS;
  static constexpr int NCT = CHUNK / 16;          // S column tiles
  static constexpr int KQ = 8 / NCT;              // head-dim parts of S (one warp each)
  static constexpr int KSTEPS = HD / 16 / KQ;     // k-steps of a warp's S part
  static constexpr int SLD = CHUNK + 4;
  static constexpr int PLD = CHUNK + 8;
  static constexpr int OT = HD / 16;              // output column tiles
  static constexpr int KSPLIT = OT >= 8 ? 1 : 8 / OT;   // warps sharing an output tile (over keys)
  static constexpr int WCOL = 8 / KSPLIT;
  static constexpr int FR = OT / WCOL;            // output tiles per warp
  static constexpr int NKS = CHUNK / 16;          // P V k-steps per chunk
  static constexpr int KSPW = NKS / KSPLIT;
  static constexpr int CPT = CHUNK / 16;          // softmax columns per thread (16 threads per row)
  static constexpr int SMEM = 2 * CHUNK * LDS * 2 + QROWS * LDS * 2 + KQ * QROWS * SLD * 4 + QROWS * PLD * 2 + 3 * QROWS * 4;
  static_assert(KQ >= 1 && KQ * NCT == 8 && FR >= 1 && KSPW >= 1 && CPT % 2 == 0, "decode: tile shape");
  static_assert(KSPLIT * QROWS * LDS * 4 <= 2 * CHUNK * LDS * 2, "decode: output staging over K/V");
  static_assert(SMEM <= 96 * 1024, "decode: Volta's 96 KB");
};

template <int HD, int FMT>
__device__ __forceinline__ void paged_decode_impl(
    half* __restrict__ out,            // [num_seqs, num_q_heads, HD]
    float* __restrict__ part_o,        // [num_splits, num_seqs, num_q_heads, HD]
    float* __restrict__ part_ml,       // [num_splits, num_seqs, num_q_heads, 2]
    const half* __restrict__ q,        // [num_seqs, num_q_heads, HD]
    const void* __restrict__ k_cache, const void* __restrict__ v_cache,
    const int* __restrict__ block_tables,  // [num_seqs, max_blocks]
    const int* __restrict__ seq_lens,      // [num_seqs]
    int num_seqs, int num_q_heads, int num_kv_heads, int block_size, int max_blocks,
    i64 stride_block, i64 stride_token, i64 stride_head,
    float scale, int window, int num_splits, int kv_shared,
    const float* __restrict__ k_scale, const float* __restrict__ v_scale) {
  typedef DecodeCfg<HD> C;
  typedef Tile<NTHREADS, HD, C::CHUNK> DT;
  typedef typename KV<FMT>::vec VecT;
  constexpr int LDS = C::LDS, CHUNK = C::CHUNK, SLD = C::SLD, PLD = C::PLD;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  half* Ks = reinterpret_cast<half*>(smem_raw);            // CHUNK x LDS, later O staging (fp32)
  half* Vs = Ks + CHUNK * LDS;                              // CHUNK x LDS
  half* Qs = Vs + CHUNK * LDS;                              // QROWS x LDS
  float* Sp = reinterpret_cast<float*>(Qs + QROWS * LDS);  // KQ x QROWS x SLD
  half* Ps = reinterpret_cast<half*>(Sp + C::KQ * QROWS * SLD);// QROWS x PLD
  float* alpha_s = reinterpret_cast<float*>(Ps + QROWS * PLD);
  float* m_s = alpha_s + QROWS;
  float* l_s = m_s + QROWS;
  if (kv_shared) Vs = Ks;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int group_size = num_q_heads / num_kv_heads;
  const int groups_per_kv = (group_size + QROWS - 1) / QROWS;
  const int kvh = blockIdx.x / groups_per_kv;
  const int qh0 = kvh * group_size + (blockIdx.x % groups_per_kv) * QROWS;
  const int nrows = min(QROWS, kvh * group_size + group_size - qh0);
  const int b = blockIdx.y;
  const int split = blockIdx.z;

  const int L = seq_lens[b];
  const int start = window > 0 ? max(0, L - window) : 0;
  const int n = L - start;
  int per = (n + num_splits - 1) / num_splits;
  per = (per + CHUNK - 1) / CHUNK * CHUNK;
  const int ts = start + split * per;
  const int te = min(L, ts + per);

  if (ts >= te) {  // empty split: neutral element for the merge
    if (num_splits > 1) {
      for (int i = tid; i < nrows * HD; i += NTHREADS) {
        const int r = i / HD, c = i % HD;
        part_o[(((i64)split * num_seqs + b) * num_q_heads + qh0 + r) * HD + c] = 0.f;
      }
      if (tid < nrows) {
        float* ml = part_ml + (((i64)split * num_seqs + b) * num_q_heads + qh0 + tid) * 2;
        ml[0] = NEG_INF;
        ml[1] = 0.f;
      }
    }
    return;
  }

  // Q rows (zero padding beyond the group) and the accumulator row map.
  for (int i = tid; i < QROWS * Dims<HD>::VEC_PER_ROW; i += NTHREADS) {
    const int r = i / Dims<HD>::VEC_PER_ROW, c = i % Dims<HD>::VEC_PER_ROW;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < nrows) v = reinterpret_cast<const uint4*>(q + ((i64)b * num_q_heads + qh0 + r) * HD)[c];
    *reinterpret_cast<uint4*>(Qs + r * LDS + c * 8) = v;
  }
  fill_row_index(Sp);
  __syncthreads();
  const unsigned rowmap = learn_row_map(Sp);

  acc_frag o[C::FR];
#pragma unroll
  for (int f = 0; f < C::FR; ++f) fill_acc(o[f], 0.f);

  float scale_log2 = scale * LOG2E;
  if constexpr (FMT != 0) scale_log2 *= kv_factor<FMT>(k_scale);
  float m_run = NEG_INF, l_run = 0.f;  // row stats, identical in the 16 threads of a row
  const int srow = tid >> 4;
  const int scol = (tid & 15) * C::CPT;

  const Pager pg(block_tables, b, max_blocks, block_size, kvh, stride_block, stride_token, stride_head);
  VecT kr[DT::VECS], vr[DT::VECS];
  {
    i64 off[DT::VECS];
    chunk_offsets<NTHREADS, HD, CHUNK>(off, pg, ts, te);
    load_chunk<NTHREADS, HD, CHUNK, FMT>(kr, k_cache, off);
    if (!kv_shared) load_chunk<NTHREADS, HD, CHUNK, FMT>(vr, v_cache, off);
  }

  for (int t0 = ts; t0 < te; t0 += CHUNK) {
    __syncthreads();  // previous chunk finished with Ks/Vs/Ps (and the row map scratch)
    store_chunk<NTHREADS, HD, CHUNK, FMT>(Ks, kr);
    if (!kv_shared) store_chunk<NTHREADS, HD, CHUNK, FMT>(Vs, vr);
    __syncthreads();
    if (t0 + CHUNK < te) {
      i64 off[DT::VECS];
      chunk_offsets<NTHREADS, HD, CHUNK>(off, pg, t0 + CHUNK, te);
      load_chunk<NTHREADS, HD, CHUNK, FMT>(kr, k_cache, off);
      if (!kv_shared) load_chunk<NTHREADS, HD, CHUNK, FMT>(vr, v_cache, off);
    }

    // S partial = Q[:, kq*KSTEPS*16 : +KSTEPS*16] K^T for column tile nt.
    {
      const int nt = warp % C::NCT, kq = warp / C::NCT;
      frag_ab a;
      frag_ab bk;
      acc_frag s;
      fill_acc(s, 0.f);
#pragma unroll
      for (int kk = 0; kk < C::KSTEPS; ++kk) {
        const int k0 = (kq * C::KSTEPS + kk) * 16;
        sload_a_row(a, Qs + k0, LDS);
        sload_b_col(bk, Ks + nt * 16 * LDS + k0, LDS);
        mma_row_col(s, a, bk);
      }
      sstore_acc_row(Sp + kq * QROWS * SLD + nt * 16, s, SLD);
    }
    __syncthreads();

    // Online softmax: 16 rows x CHUNK columns, 16 threads per row, CPT columns each.
    {
      float sv[C::CPT];
#pragma unroll
      for (int j = 0; j < C::CPT; ++j) {
        const int c = scol + j;
        float v = Sp[srow * SLD + c];
#pragma unroll
        for (int kq = 1; kq < C::KQ; ++kq) v += Sp[(kq * QROWS + srow) * SLD + c];
        sv[j] = (t0 + c < te) ? v * scale_log2 : NEG_INF;
      }
      float mx = sv[0];
#pragma unroll
      for (int j = 1; j < C::CPT; ++j) mx = fmaxf(mx, sv[j]);
      mx = warp_max_width(mx, 16);
      const float m_new = fmaxf(m_run, mx);  // finite: every chunk holds a valid key
      float ps = 0.f;
#pragma unroll
      for (int j = 0; j < C::CPT; ++j) {
        sv[j] = exp2f(sv[j] - m_new);
        ps = j == 0 ? sv[0] : ps + sv[j];
      }
      const float rs = warp_sum_width(ps, 16);
      const float alpha = exp2f(m_run - m_new);
      l_run = l_run * alpha + rs;
      m_run = m_new;
#pragma unroll
      for (int j = 0; j < C::CPT; j += 2)
        *reinterpret_cast<half2*>(Ps + srow * PLD + scol + j) = __floats2half2_rn(sv[j], sv[j + 1]);
      if ((tid & 15) == 0) alpha_s[srow] = alpha;
    }
    __syncthreads();

    // O = O * alpha + P V for this warp's output tiles (and its share of the chunk's keys).
    {
      const int wc = warp % C::WCOL, kg = warp / C::WCOL;
#pragma unroll
      for (int f = 0; f < C::FR; ++f)
#pragma unroll
        for (int i = 0; i < acc_frag::num_elements; ++i) o[f].x[i] *= alpha_s[row_of(rowmap, i)];
      frag_ab a;
      frag_ab bv;
#pragma unroll
      for (int kk = 0; kk < C::KSPW; ++kk) {
        const int ks = kg * C::KSPW + kk;
        sload_a_row(a, Ps + ks * 16, PLD);
#pragma unroll
        for (int f = 0; f < C::FR; ++f) {
          sload_b_row(bv, Vs + ks * 16 * LDS + (wc * C::FR + f) * 16, LDS);
          mma_row_row(o[f], a, bv);
        }
      }
    }
  }

  // Stage O (fp32, KSPLIT x 16 x LDS) over Ks/Vs and write it out.
  __syncthreads();
  if ((tid & 15) == 0) {
    m_s[srow] = m_run;
    l_s[srow] = l_run;
  }
  float* Os = reinterpret_cast<float*>(smem_raw);
  {
    const int wc = warp % C::WCOL, kg = warp / C::WCOL;
#pragma unroll
    for (int f = 0; f < C::FR; ++f) sstore_acc_row(Os + kg * QROWS * LDS + (wc * C::FR + f) * 16, o[f], LDS);
  }
  __syncthreads();
  float vf = 1.f;
  if constexpr (FMT != 0) vf = kv_factor<FMT>(v_scale);

  for (int i = tid; i < nrows * (HD / 4); i += NTHREADS) {
    const int r = i / (HD / 4), c = (i % (HD / 4)) * 4;
    float4 v = *reinterpret_cast<const float4*>(Os + r * LDS + c);
#pragma unroll
    for (int g = 1; g < C::KSPLIT; ++g) {
      const float4 w = *reinterpret_cast<const float4*>(Os + (g * QROWS + r) * LDS + c);
      v.x += w.x; v.y += w.y; v.z += w.z; v.w += w.w;
    }
    if constexpr (FMT != 0) { v.x *= vf; v.y *= vf; v.z *= vf; v.w *= vf; }
    if (num_splits == 1) {
      const float inv = 1.f / l_s[r];
      half2* dst = reinterpret_cast<half2*>(out + ((i64)b * num_q_heads + qh0 + r) * HD + c);
      dst[0] = __floats2half2_rn(v.x * inv, v.y * inv);
      dst[1] = __floats2half2_rn(v.z * inv, v.w * inv);
    } else {
      *reinterpret_cast<float4*>(part_o + (((i64)split * num_seqs + b) * num_q_heads + qh0 + r) * HD + c) = v;
    }
  }
  if (num_splits > 1 && tid < nrows) {
    float* ml = part_ml + (((i64)split * num_seqs + b) * num_q_heads + qh0 + tid) * 2;
    ml[0] = m_s[tid];
    ml[1] = l_s[tid];
  }
}

// Merge split results: out = sum_s 2^(m_s - M) O_s / sum_s 2^(m_s - M) l_s.
// Grid (num_q_heads, num_seqs, HD / MC): a block merges MC (= min(128, HD)) columns of
// one row, one column per thread, so a small batch still spreads the merge over
// many SMs.  The split weights are computed once per block into shared memory
// (threads over splits); then every thread streams its column of all splits
// (coalesced rows, independent loads in flight).  num_splits <= MAX_SPLITS (the
// launcher checks).
template <int HD>
__device__ __forceinline__ void paged_decode_reduce_impl(half* __restrict__ out, const float* __restrict__ part_o,
                                                         const float* __restrict__ part_ml, int num_seqs, int num_q_heads,
                                                         int num_splits) {
  constexpr int MC = HD < 128 ? HD : 128;
  constexpr int NW = MC / 32;
  __shared__ float w_s[MAX_SPLITS];
  __shared__ float red[NW];
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int c = blockIdx.z * MC + tid;
  const i64 row0 = (i64)b * num_q_heads + h, step = (i64)num_seqs * num_q_heads;
  float mloc = NEG_INF;
  for (int s = tid; s < num_splits; s += MC) mloc = fmaxf(mloc, part_ml[(row0 + s * step) * 2]);
  mloc = warp_max_width(mloc, 32);
  if ((tid & 31) == 0) red[tid >> 5] = mloc;
  __syncthreads();
  float M = red[0];
#pragma unroll
  for (int w = 1; w < NW; ++w) M = fmaxf(M, red[w]);
  __syncthreads();
  float dloc = 0.f;
  for (int s = tid; s < num_splits; s += MC) {
    const float l = part_ml[(row0 + s * step) * 2 + 1];
    const float w = l == 0.f ? 0.f : exp2f(part_ml[(row0 + s * step) * 2] - M);  // empty split: weight 0
    w_s[s] = w;
    dloc += w * l;
  }
  dloc = warp_sum_width(dloc, 32);
  if ((tid & 31) == 0) red[tid >> 5] = dloc;
  __syncthreads();
  float den = red[0];
#pragma unroll
  for (int w = 1; w < NW; ++w) den += red[w];
  const float inv = 1.f / den;
  float acc = 0.f;
#pragma unroll 8
  for (int s = 0; s < num_splits; ++s) acc += w_s[s] * part_o[(row0 + s * step) * HD + c];
  out[row0 * HD + c] = __float2half_rn(acc * inv);
}

// One entry point per (head dim, KV format): paged_decode_d<HD>[_e4m3|_e5m2], paged_decode_d<HD>_reduce.
#define DECODE_ENTRY(NAME, HDV, FMTV)                                                                          \
  extern "C" __global__ void __launch_bounds__(NTHREADS, DECODE_MIN_BLOCKS)                                  \
  NAME(half* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_ml, const half* __restrict__ q, \
       const void* __restrict__ k_cache, const void* __restrict__ v_cache, const int* __restrict__ block_tables,    \
       const int* __restrict__ seq_lens, int num_seqs, int num_q_heads, int num_kv_heads, int block_size,         \
       int max_blocks, i64 stride_block, i64 stride_token, i64 stride_head, float scale, int window,              \
       int num_splits, int kv_shared, const float* __restrict__ k_scale, const float* __restrict__ v_scale) {     \
    paged_decode_impl<HDV, FMTV>(out, part_o, part_ml, q, k_cache, v_cache, block_tables, seq_lens, num_seqs,     \
                                 num_q_heads, num_kv_heads, block_size, max_blocks, stride_block, stride_token,  \
                                 stride_head, scale, window, num_splits, kv_shared, k_scale, v_scale);            \
  }
#define REDUCE_ENTRY(NAME, HDV)                                                                                \
  extern "C" __global__ void __launch_bounds__(HDV < 128 ? HDV : 128)                                         \
  NAME(half* __restrict__ out, const float* __restrict__ part_o, const float* __restrict__ part_ml, int num_seqs, \
       int num_q_heads, int num_splits) {                                                                      \
    paged_decode_reduce_impl<HDV>(out, part_o, part_ml, num_seqs, num_q_heads, num_splits);                    \
  }
#define DECODE_FAMILY(HDV)                                 \
  DECODE_ENTRY(paged_decode_d##HDV, HDV, 0)                \
  DECODE_ENTRY(paged_decode_d##HDV##_e4m3, HDV, 1)         \
  DECODE_ENTRY(paged_decode_d##HDV##_e5m2, HDV, 2)         \
  REDUCE_ENTRY(paged_decode_d##HDV##_reduce, HDV)

DECODE_FAMILY(64)
DECODE_FAMILY(128)
DECODE_FAMILY(256)
DECODE_FAMILY(512)
