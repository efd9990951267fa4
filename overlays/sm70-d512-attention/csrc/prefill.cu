// Prefill attention over variable-length sequences for head dims 64/128/256/512, fp16
// queries and output, fp16 or fp8 (e4m3 / e5m2, per-tensor scale) KV cache, fp32
// accumulation, keys/values read from the paged KV cache.
//
// Sequence b owns query tokens cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 and has
// seq_lens[b] keys in the cache (its earlier context plus the new tokens), so
// query i sits at position seq_lens[b] - q_len + i (chunked prefill and prefix
// caching need no special case).  Causal masking and a left sliding window
// (position - key < window) are optional.
//
// One block = BM query rows of one query head, 512 threads (16 warps);
// grid (q tiles, seqs, q heads).  BM x CH = 32 x 32 at HD 512 (Volta's 96 KB allows no
// more), 64 x 64 below (a quarter of the barriers and softmax passes per FLOP).  Per
// CH-key chunk: K -> shared, S = Q K^T (the BM x CH score tiles x head-dim parts over
// the 16 warps), online softmax, V -> the same shared buffer, O = O * alpha + P V with
// the warps as WR row groups x WC column groups.  Both the next chunk's K and V are in
// flight while the current chunk is computed: K(j+1) is issued right after K(j) lands
// in shared memory, V(j+1) right after V(j) does.  With kv_shared (K = V, Gemma-4
// global layers) V is neither loaded nor stored.  fp8 chunks are widened to fp16 on
// the way into shared memory; the K scale is folded into the softmax scale and the V
// scale into the final normalisation.
//
// Shared memory (bytes, PrefillCfg::SMEM): Q BM x (HD+8) halves, K/V CH x (HD+8) (both
// reused as the fp32 BM x (HD+8) output staging), S partials KQ x BM x (CH+4) floats,
// P BM x (CH+8) halves, row stats 2 x BM floats: HD 512 87,808; 256 94,720; 128 61,952;
// 64 45,568.  Every WMMA access to shared memory uses the .shared state space with a
// 32-bit address formed from a base computed once; the O rescale is skipped when no
// row's running maximum moved in the chunk; key offsets inside a cache block are
// 32-bit.  Together +10-15 % on the H200 at HD 512 (docs/kernels.md).  The HD 512
// instance performs the operations of the kernel measured there, in the same order.
#include "attn_common.cuh"

#define NTHREADS 512

template <int HD> struct PrefillCfg {
  static constexpr int BM = HD >= 512 ? 32 : 64;
  static constexpr int CH = HD >= 512 ? 32 : 64;
  static constexpr int LDS = Dims<HD>::LDS;
  static constexpr int MT = BM / 16, NTL = CH / 16;
  static constexpr int KQ = 16 / (MT * NTL);       // head-dim parts of S (one warp per tile and part)
  static constexpr int KSTEPS = HD / 16 / KQ;
  static constexpr int SLD = CH + 4;
  static constexpr int PLD = CH + 8;
  static constexpr int OT = HD / 16;               // output column tiles
  static constexpr int PNF = OT >= 8 ? 2 : 1;      // column tiles per warp
  static constexpr int WC = OT / PNF < 16 ? OT / PNF : 16;
  static constexpr int WR = 16 / WC;
  static constexpr int PMT = MT / WR;              // row tiles per warp
  static constexpr int TPR = NTHREADS / BM;        // softmax threads per row
  static constexpr int CPT = CH / TPR;
  static constexpr int SMEM = BM * LDS * 2 + CH * LDS * 2 + KQ * BM * SLD * 4 + BM * PLD * 2 + 2 * BM * 4;
  static_assert(KQ >= 1 && KQ * MT * NTL == 16 && WC * PNF == OT && WR * PMT == MT && CPT % 2 == 0 && TPR <= 32,
                "prefill: tile shape");
  static_assert(BM <= CH, "prefill: fp32 output staging over Q and K/V");
  static_assert(SMEM <= 96 * 1024, "prefill: Volta's 96 KB");
};

// chunk_offsets with the in-block term in 32-bit arithmetic (slot < block_size, and
// block_size * stride_token + num_kv_heads * stride_head < 2^31 for every vLLM cache
// layout; the launcher checks it).
template <int HD, int CH>
__device__ __forceinline__ void chunk_offsets32(i64 (&off)[Tile<NTHREADS, HD, CH>::VECS], const Pager& pg, int t0,
                                                int t_end) {
  typedef Tile<NTHREADS, HD, CH> T;
  const int st = (int)pg.st;
#pragma unroll
  for (int j = 0; j < T::VECS; ++j) {
    const int t = t0 + (int)threadIdx.x / T::VPR + j * T::ROWS_PER_PASS;
    int blk_idx, slot;
    if (pg.shift >= 0) { blk_idx = t >> pg.shift; slot = t & (pg.block_size - 1); }
    else { blk_idx = t / pg.block_size; slot = t - blk_idx * pg.block_size; }
    off[j] = t < t_end ? (i64)__ldg(pg.table + blk_idx) * pg.sb + (i64)((int)pg.head_off + slot * st) : -1;
  }
}

template <int HD, int FMT>
__device__ __forceinline__ void prefill_impl(
    half* __restrict__ out,              // [total_q, num_q_heads, HD]
    const half* __restrict__ q,          // [total_q, num_q_heads, HD]
    const void* __restrict__ k_cache, const void* __restrict__ v_cache,
    const int* __restrict__ block_tables,  // [num_seqs, max_blocks]
    const int* __restrict__ cu_seqlens_q,  // [num_seqs + 1]
    const int* __restrict__ seq_lens,      // [num_seqs]
    int num_q_heads, int num_kv_heads, int block_size, int max_blocks,
    i64 stride_block, i64 stride_token, i64 stride_head,
    float scale, int causal, int window, int kv_shared,
    const float* __restrict__ k_scale, const float* __restrict__ v_scale) {
  typedef PrefillCfg<HD> C;
  typedef Tile<NTHREADS, HD, C::CH> PT;
  typedef typename KV<FMT>::vec VecT;
  constexpr int LDS = C::LDS, BM = C::BM, CH = C::CH, SLD = C::SLD, PLD = C::PLD;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  half* Qs = reinterpret_cast<half*>(smem_raw);             // BM x LDS
  half* KVs = Qs + BM * LDS;                                // CH x LDS
  float* Sp = reinterpret_cast<float*>(KVs + CH * LDS);     // KQ x BM x SLD
  half* Ps = reinterpret_cast<half*>(Sp + C::KQ * BM * SLD);// BM x PLD
  float* alpha_s = reinterpret_cast<float*>(Ps + BM * PLD);
  float* l_s = alpha_s + BM;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int b = blockIdx.y;
  const int h = blockIdx.z;
  const int kvh = h / (num_q_heads / num_kv_heads);
  const int q_start = cu_seqlens_q[b];
  const int q_len = cu_seqlens_q[b + 1] - q_start;
  const int m0 = (gridDim.x - 1 - blockIdx.x) * BM;  // longest causal rows first
  if (m0 >= q_len) return;
  const int kv_len = seq_lens[b];
  const int ctx = kv_len - q_len;          // position of query 0
  const int rows = min(BM, q_len - m0);

  int k_end = kv_len;
  if (causal) k_end = min(kv_len, ctx + m0 + rows);
  int k_begin = 0;
  if (window > 0) k_begin = max(0, ctx + m0 - window + 1);

  for (int i = tid; i < BM * Dims<HD>::VEC_PER_ROW; i += NTHREADS) {
    const int r = i / Dims<HD>::VEC_PER_ROW, c = i % Dims<HD>::VEC_PER_ROW;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows) v = reinterpret_cast<const uint4*>(q + ((i64)(q_start + m0 + r) * num_q_heads + h) * HD)[c];
    *reinterpret_cast<uint4*>(Qs + r * LDS + c * 8) = v;
  }
  fill_row_index(Sp);
  __syncthreads();
  const unsigned rowmap = learn_row_map(Sp);

  acc_frag o[C::PMT][C::PNF];  // [row tile][column tile] of this warp's output block
#pragma unroll
  for (int mt = 0; mt < C::PMT; ++mt)
#pragma unroll
    for (int f = 0; f < C::PNF; ++f) fill_acc(o[mt][f], 0.f);

  float scale_log2 = scale * LOG2E;
  if constexpr (FMT != 0) scale_log2 *= kv_factor<FMT>(k_scale);
  const int srow = tid / C::TPR;
  const int scol = (tid % C::TPR) * C::CPT;
  const int qpos = ctx + m0 + srow;
  float m_run = NEG_INF, l_run = 0.f;

  // 32-bit shared addresses, computed once (the fragment loads then take base + constant offsets)
  const unsigned qs_s = smem_u32(Qs), kv_s = smem_u32(KVs), sp_s = smem_u32(Sp), ps_s = smem_u32(Ps);
  const int wr = warp / C::WC, wc = warp % C::WC;
  const unsigned kv_w = kv_s + 2u * (wc * C::PNF * 16);
  const Pager pg(block_tables, b, max_blocks, block_size, kvh, stride_block, stride_token, stride_head);
  VecT kr[PT::VECS], vr[PT::VECS];
  {
    i64 off[PT::VECS];
    chunk_offsets32<HD, CH>(off, pg, k_begin, k_end);
    load_chunk<NTHREADS, HD, CH, FMT>(kr, k_cache, off);
    if (!kv_shared) load_chunk<NTHREADS, HD, CH, FMT>(vr, v_cache, off);
  }

  for (int t0 = k_begin; t0 < k_end; t0 += CH) {
    const bool more = t0 + CH < k_end;
    int rescale = 0;
    i64 off[PT::VECS];
    if (more) chunk_offsets32<HD, CH>(off, pg, t0 + CH, k_end);
    __syncthreads();  // previous P V done with KVs / Ps / alpha_s
    store_chunk<NTHREADS, HD, CH, FMT>(KVs, kr);
    __syncthreads();
    if (more) load_chunk<NTHREADS, HD, CH, FMT>(kr, k_cache, off);

    {  // S partials: tile (mt, nt), head-dim part kq
      const int mt = warp % C::MT, nt = (warp / C::MT) % C::NTL, kq = warp / (C::MT * C::NTL);
      frag_ab a, bk;
      acc_frag s;
      fill_acc(s, 0.f);
      const unsigned qa = qs_s + 2u * (mt * 16 * LDS + kq * C::KSTEPS * 16),
                     kb = kv_s + 2u * (nt * 16 * LDS + kq * C::KSTEPS * 16);
#pragma unroll
      for (int kk = 0; kk < C::KSTEPS; ++kk) {
        uload_a_row(a, qa + 32u * kk, LDS);
        uload_b_col(bk, kb + 32u * kk, LDS);
        mma_row_col(s, a, bk);
      }
      ustore_acc_row(sp_s + 4u * (kq * BM * SLD + mt * 16 * SLD + nt * 16), s, SLD);
    }
    __syncthreads();

    {  // online softmax: BM rows x CH columns, TPR threads per row, CPT columns each
      float sv[C::CPT];
#pragma unroll
      for (int j = 0; j < C::CPT; ++j) {
        const int c = scol + j;
        const int key = t0 + c;
        bool ok = key < k_end;
        if (causal) ok = ok && key <= qpos;
        if (window > 0) ok = ok && (qpos - key) < window;
        float v = Sp[srow * SLD + c];
#pragma unroll
        for (int kq = 1; kq < C::KQ; ++kq) v += Sp[(kq * BM + srow) * SLD + c];
        sv[j] = ok ? v * scale_log2 : NEG_INF;
      }
      float mx = sv[0];
#pragma unroll
      for (int j = 1; j < C::CPT; ++j) mx = fmaxf(mx, sv[j]);
      mx = warp_max_width(mx, C::TPR);
      const float m_new = fmaxf(m_run, mx);
      float ps = 0.f, alpha = 1.f;
      if (m_new != NEG_INF) {  // else nothing visible to this row yet
#pragma unroll
        for (int j = 0; j < C::CPT; ++j) {
          sv[j] = exp2f(sv[j] - m_new);
          ps = j == 0 ? sv[0] : ps + sv[j];
        }
        alpha = exp2f(m_run - m_new);
      } else {
#pragma unroll
        for (int j = 0; j < C::CPT; ++j) sv[j] = 0.f;
      }
      const float rs = warp_sum_width(ps, C::TPR);
      l_run = l_run * alpha + rs;
      m_run = m_new;
#pragma unroll
      for (int j = 0; j < C::CPT; j += 2)
        *reinterpret_cast<half2*>(Ps + srow * PLD + scol + j) = __floats2half2_rn(sv[j], sv[j + 1]);
      if ((tid % C::TPR) == 0) alpha_s[srow] = alpha;
      rescale = alpha != 1.f;
    }
    // all S reads of KVs done; P, alpha visible; and whether any row's running max moved
    rescale = __syncthreads_or(rescale);
    if (!kv_shared) {
      store_chunk<NTHREADS, HD, CH, FMT>(KVs, vr);
      __syncthreads();
      if (more) load_chunk<NTHREADS, HD, CH, FMT>(vr, v_cache, off);
    }

    {  // O = O * alpha + P V
      if (rescale)  // block-uniform: no row's maximum moved -> every alpha is exactly 1
#pragma unroll
        for (int mt = 0; mt < C::PMT; ++mt)
#pragma unroll
          for (int f = 0; f < C::PNF; ++f)
#pragma unroll
            for (int i = 0; i < acc_frag::num_elements; ++i)
              o[mt][f].x[i] *= alpha_s[(wr * C::PMT + mt) * 16 + row_of(rowmap, i)];
      frag_ab a[C::PMT], bv;
#pragma unroll
      for (int ks = 0; ks < CH / 16; ++ks) {
#pragma unroll
        for (int mt = 0; mt < C::PMT; ++mt) uload_a_row(a[mt], ps_s + 2u * ((wr * C::PMT + mt) * 16 * PLD + ks * 16), PLD);
#pragma unroll
        for (int f = 0; f < C::PNF; ++f) {
          uload_b_row(bv, kv_w + 2u * (ks * 16 * LDS + f * 16), LDS);
#pragma unroll
          for (int mt = 0; mt < C::PMT; ++mt) mma_row_row(o[mt][f], a[mt], bv);
        }
      }
    }
  }

  __syncthreads();
  if ((tid % C::TPR) == 0) l_s[srow] = l_run;
  float* Os = reinterpret_cast<float*>(smem_raw);  // BM x LDS floats over Q and K/V
#pragma unroll
  for (int mt = 0; mt < C::PMT; ++mt)
#pragma unroll
    for (int f = 0; f < C::PNF; ++f)
      sstore_acc_row(Os + (wr * C::PMT + mt) * 16 * LDS + wc * C::PNF * 16 + f * 16, o[mt][f], LDS);
  __syncthreads();
  float vf = 1.f;
  if constexpr (FMT != 0) vf = kv_factor<FMT>(v_scale);
  for (int i = tid; i < rows * (HD / 4); i += NTHREADS) {
    const int r = i / (HD / 4), c = (i % (HD / 4)) * 4;
    const float l = l_s[r];
    float inv = l > 0.f ? 1.f / l : 0.f;
    if constexpr (FMT != 0) inv *= vf;
    const float4 v = *reinterpret_cast<const float4*>(Os + r * LDS + c);
    half2* dst = reinterpret_cast<half2*>(out + ((i64)(q_start + m0 + r) * num_q_heads + h) * HD + c);
    dst[0] = __floats2half2_rn(v.x * inv, v.y * inv);
    dst[1] = __floats2half2_rn(v.z * inv, v.w * inv);
  }
}

// One entry point per (head dim, KV format): prefill_d<HD>[_e4m3|_e5m2].
#define PREFILL_ENTRY(NAME, HDV, FMTV)                                                                         \
  extern "C" __global__ void __launch_bounds__(NTHREADS, 1)                                                   \
  NAME(half* __restrict__ out, const half* __restrict__ q, const void* __restrict__ k_cache,                  \
       const void* __restrict__ v_cache, const int* __restrict__ block_tables, const int* __restrict__ cu_seqlens_q, \
       const int* __restrict__ seq_lens, int num_q_heads, int num_kv_heads, int block_size, int max_blocks,    \
       i64 stride_block, i64 stride_token, i64 stride_head, float scale, int causal, int window, int kv_shared, \
       const float* __restrict__ k_scale, const float* __restrict__ v_scale) {                                 \
    prefill_impl<HDV, FMTV>(out, q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, num_q_heads,       \
                            num_kv_heads, block_size, max_blocks, stride_block, stride_token, stride_head, scale, \
                            causal, window, kv_shared, k_scale, v_scale);                                      \
  }
#define PREFILL_FAMILY(HDV)                          \
  PREFILL_ENTRY(prefill_d##HDV, HDV, 0)              \
  PREFILL_ENTRY(prefill_d##HDV##_e4m3, HDV, 1)       \
  PREFILL_ENTRY(prefill_d##HDV##_e5m2, HDV, 2)

PREFILL_FAMILY(64)
PREFILL_FAMILY(128)
PREFILL_FAMILY(256)
PREFILL_FAMILY(512)
