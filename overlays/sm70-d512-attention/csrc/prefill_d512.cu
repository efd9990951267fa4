// Prefill attention over variable-length sequences, head_dim 512, fp16 in/out,
// fp32 accumulation, keys/values read from the paged KV cache.
//
// Sequence b owns query tokens cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 and has
// seq_lens[b] keys in the cache (its earlier context plus the new tokens), so
// query i sits at position seq_lens[b] - q_len + i (chunked prefill and prefix
// caching need no special case).  Causal masking and a left sliding window
// (position - key < window) are optional.
//
// One block = 32 query rows of one query head, 512 threads (16 warps);
// grid (q tiles, seqs, q heads).  Per 32-key chunk: K -> shared,
// S = Q K^T (4 tiles x 4 head-dim quarters over the 16 warps), online softmax,
// V -> the same shared buffer, O = O * alpha + P V with each warp owning 32
// output columns (4 accumulator tiles).  Both the next chunk's K and V are in
// flight while the current chunk is computed: K(j+1) is issued right after
// K(j) lands in shared memory, V(j+1) right after V(j) does.  With kv_shared
// (K = V, Gemma-4 global layers) V is neither loaded nor stored.
//
// Shared memory (bytes): Q 32x520 halves 33280, K/V 33280 (both reused as
// the fp32 32x520 output staging), S partials 4x32x36 floats 18432,
// P 32x40 halves 2560, row stats 256 = 87808 (< 96 KB).  Every WMMA access to
// shared memory uses the .shared state space with a 32-bit address formed from a
// base computed once (PREFILL_SADDR); the O rescale is skipped when no row's
// running maximum moved in the chunk (PREFILL_SKIP_RESCALE); key offsets inside a
// cache block are 32-bit (PREFILL_OFF32).  Together +10-15 % on the H200.
#include "d512_common.cuh"

#ifndef PREFILL_ALT
// ---------------------------------------------------------------------------
// The committed kernel (512 threads, 32 rows x 32 keys, one block per SM).
// -DPREFILL_ALT selects the alternative design below (benchmarks/kernel_variants.py).
// ---------------------------------------------------------------------------

// Compile-time options (benchmarks/kernel_variants.py builds them side by side; H200 numbers in
// docs/kernels.md, "Prefill: the untried designs"). The defaults are the measured winner.
#ifndef PREFILL_SADDR
#define PREFILL_SADDR 1   // 32-bit shared addresses, base once + constant offsets, for every WMMA
#endif                    // fragment access (0: a generic pointer converted per access)
#ifndef PREFILL_SKIP_RESCALE
#define PREFILL_SKIP_RESCALE 1   // skip O *= alpha when no row's running maximum moved (__syncthreads_or)
#endif
#ifndef PREFILL_OFF32
#define PREFILL_OFF32 1   // the in-block part of a key's cache offset in 32 bits (see chunk_offsets32)
#endif
#ifndef PREFILL_S2ACC
#define PREFILL_S2ACC 0   // 1: two S accumulators (even / odd k-steps); measured, no gain
#endif
#define NTHREADS 512
#define BM 32
#define SLD 36
#define PLD 40
typedef Tile<NTHREADS> PT;

#if PREFILL_OFF32
// chunk_offsets with the in-block term in 32-bit arithmetic (slot < block_size, and
// block_size * stride_token + num_kv_heads * stride_head < 2^31 for every vLLM cache
// layout; the launcher checks it).
__device__ __forceinline__ void chunk_offsets32(i64 (&off)[PT::VECS], const Pager& pg, int t0, int t_end) {
  const int st = (int)pg.st;
#pragma unroll
  for (int j = 0; j < PT::VECS; ++j) {
    const int t = t0 + (int)threadIdx.x / VEC_PER_ROW + j * PT::ROWS_PER_PASS;
    int blk_idx, slot;
    if (pg.shift >= 0) { blk_idx = t >> pg.shift; slot = t & (pg.block_size - 1); }
    else { blk_idx = t / pg.block_size; slot = t - blk_idx * pg.block_size; }
    off[j] = t < t_end ? (i64)__ldg(pg.table + blk_idx) * pg.sb + (i64)((int)pg.head_off + slot * st) : -1;
  }
}
#define CHUNK_OFFSETS chunk_offsets32
#else
#define CHUNK_OFFSETS chunk_offsets<NTHREADS>
#endif

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
prefill_d512(half* __restrict__ out,              // [total_q, num_q_heads, 512]
             const half* __restrict__ q,          // [total_q, num_q_heads, 512]
             const half* __restrict__ k_cache,
             const half* __restrict__ v_cache,
             const int* __restrict__ block_tables,  // [num_seqs, max_blocks]
             const int* __restrict__ cu_seqlens_q,  // [num_seqs + 1]
             const int* __restrict__ seq_lens,      // [num_seqs]
             int num_q_heads, int num_kv_heads, int block_size, int max_blocks,
             i64 stride_block, i64 stride_token, i64 stride_head,
             float scale, int causal, int window, int kv_shared) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  half* Qs = reinterpret_cast<half*>(smem_raw);             // BM x LDS
  half* KVs = Qs + BM * LDS;                                // CHUNK x LDS
  float* Sp = reinterpret_cast<float*>(KVs + CHUNK * LDS);  // 4 x BM x SLD
  half* Ps = reinterpret_cast<half*>(Sp + 4 * BM * SLD);    // BM x PLD
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

  for (int i = tid; i < BM * VEC_PER_ROW; i += NTHREADS) {
    const int r = i / VEC_PER_ROW, c = i % VEC_PER_ROW;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows) v = reinterpret_cast<const uint4*>(q + ((i64)(q_start + m0 + r) * num_q_heads + h) * HD)[c];
    *reinterpret_cast<uint4*>(Qs + r * LDS + c * 8) = v;
  }
  fill_row_index(Sp);
  __syncthreads();
  const unsigned rowmap = learn_row_map(Sp);

  acc_frag o[2][2];  // [m tile][n tile] for columns warp*32 .. warp*32+31
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int f = 0; f < 2; ++f) fill_acc(o[mt][f], 0.f);

  const float scale_log2 = scale * LOG2E;
  const int srow = tid >> 4;        // 32 rows, 16 threads each
  const int scol = (tid & 15) * 2;  // 2 columns each
  const int qpos = ctx + m0 + srow;
  float m_run = NEG_INF, l_run = 0.f;

#if PREFILL_SADDR
  // 32-bit shared addresses, computed once (the fragment loads then take base + constant offsets)
  const unsigned qs_s = smem_u32(Qs), kv_s = smem_u32(KVs), sp_s = smem_u32(Sp), ps_s = smem_u32(Ps);
  const unsigned kv_w = kv_s + 2u * (warp * 32);
#endif
  const Pager pg(block_tables, b, max_blocks, block_size, kvh, stride_block, stride_token, stride_head);
  uint4 kr[PT::VECS], vr[PT::VECS];
  {
    i64 off[PT::VECS];
    CHUNK_OFFSETS(off, pg, k_begin, k_end);
    load_chunk<NTHREADS>(kr, k_cache, off);
    if (!kv_shared) load_chunk<NTHREADS>(vr, v_cache, off);
  }

  for (int t0 = k_begin; t0 < k_end; t0 += CHUNK) {
    const bool more = t0 + CHUNK < k_end;
#if PREFILL_SKIP_RESCALE
    int rescale = 0;
#endif
    i64 off[PT::VECS];
    if (more) CHUNK_OFFSETS(off, pg, t0 + CHUNK, k_end);
    __syncthreads();  // previous P V done with KVs / Ps / alpha_s
    store_chunk<NTHREADS>(KVs, kr);
    __syncthreads();
    if (more) load_chunk<NTHREADS>(kr, k_cache, off);

    {  // S partials: tile (mt, nt), head-dim quarter kq
      const int mt = warp & 1, nt = (warp >> 1) & 1, kq = warp >> 2;
      frag_ab a, bk;
      acc_frag s;
      fill_acc(s, 0.f);
#if PREFILL_S2ACC
      acc_frag s2;
      fill_acc(s2, 0.f);
#endif
#if PREFILL_SADDR
      const unsigned qa = qs_s + 2u * (mt * 16 * LDS + kq * 128), kb = kv_s + 2u * (nt * 16 * LDS + kq * 128);
#endif
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
#if PREFILL_SADDR
        uload_a_row(a, qa + 32u * kk, LDS);
        uload_b_col(bk, kb + 32u * kk, LDS);
#else
        const int k0 = (kq * 8 + kk) * 16;
        sload_a_row(a, Qs + mt * 16 * LDS + k0, LDS);
        sload_b_col(bk, KVs + nt * 16 * LDS + k0, LDS);
#endif
#if PREFILL_S2ACC
        if (kk & 1) mma_row_col(s2, a, bk);
        else
#endif
        mma_row_col(s, a, bk);
      }
#if PREFILL_S2ACC
#pragma unroll
      for (int i = 0; i < acc_frag::num_elements; ++i) s.x[i] += s2.x[i];
#endif
#if PREFILL_SADDR
      ustore_acc_row(sp_s + 4u * (kq * BM * SLD + mt * 16 * SLD + nt * 16), s, SLD);
#else
      sstore_acc_row(Sp + kq * BM * SLD + mt * 16 * SLD + nt * 16, s, SLD);
#endif
    }
    __syncthreads();

    {  // online softmax: 32 rows x 32 columns, 16 threads per row
      float sv[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = scol + j;
        const int key = t0 + c;
        bool ok = key < k_end;
        if (causal) ok = ok && key <= qpos;
        if (window > 0) ok = ok && (qpos - key) < window;
        const float v = Sp[srow * SLD + c] + Sp[(BM + srow) * SLD + c] + Sp[(2 * BM + srow) * SLD + c] +
                        Sp[(3 * BM + srow) * SLD + c];
        sv[j] = ok ? v * scale_log2 : NEG_INF;
      }
      const float mx = warp_max_width(fmaxf(sv[0], sv[1]), 16);
      const float m_new = fmaxf(m_run, mx);
      float p0 = 0.f, p1 = 0.f, alpha = 1.f;
      if (m_new != NEG_INF) {  // else nothing visible to this row yet
        p0 = exp2f(sv[0] - m_new);
        p1 = exp2f(sv[1] - m_new);
        alpha = exp2f(m_run - m_new);
      }
      const float rs = warp_sum_width(p0 + p1, 16);
      l_run = l_run * alpha + rs;
      m_run = m_new;
      *reinterpret_cast<half2*>(Ps + srow * PLD + scol) = __floats2half2_rn(p0, p1);
      if ((tid & 15) == 0) alpha_s[srow] = alpha;
#if PREFILL_SKIP_RESCALE
      rescale = alpha != 1.f;
#endif
    }
#if PREFILL_SKIP_RESCALE
    // all S reads of KVs done; P, alpha visible; and whether any row's running max moved
    rescale = __syncthreads_or(rescale);
#else
    __syncthreads();  // all S reads of KVs done; P, alpha visible
#endif
    if (!kv_shared) {
      store_chunk<NTHREADS>(KVs, vr);
      __syncthreads();
      if (more) load_chunk<NTHREADS>(vr, v_cache, off);
    }

    {  // O = O * alpha + P V
#if PREFILL_SKIP_RESCALE
      if (rescale)  // block-uniform: no row's maximum moved -> every alpha is exactly 1
#endif
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int f = 0; f < 2; ++f)
#pragma unroll
          for (int i = 0; i < acc_frag::num_elements; ++i) o[mt][f].x[i] *= alpha_s[mt * 16 + row_of(rowmap, i)];
      frag_ab a[2], bv;
#pragma unroll
      for (int ks = 0; ks < CHUNK / 16; ++ks) {
#if PREFILL_SADDR
        uload_a_row(a[0], ps_s + 2u * (ks * 16), PLD);
        uload_a_row(a[1], ps_s + 2u * (16 * PLD + ks * 16), PLD);
#else
        sload_a_row(a[0], Ps + ks * 16, PLD);
        sload_a_row(a[1], Ps + 16 * PLD + ks * 16, PLD);
#endif
#pragma unroll
        for (int f = 0; f < 2; ++f) {
#if PREFILL_SADDR
          uload_b_row(bv, kv_w + 2u * (ks * 16 * LDS + f * 16), LDS);
#else
          sload_b_row(bv, KVs + ks * 16 * LDS + warp * 32 + f * 16, LDS);
#endif
          mma_row_row(o[0][f], a[0], bv);
          mma_row_row(o[1][f], a[1], bv);
        }
      }
    }
  }

  __syncthreads();
  if ((tid & 15) == 0) l_s[srow] = l_run;
  float* Os = reinterpret_cast<float*>(smem_raw);  // BM x LDS floats over Q and K/V
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int f = 0; f < 2; ++f)
      sstore_acc_row(Os + mt * 16 * LDS + warp * 32 + f * 16, o[mt][f], LDS);
  __syncthreads();
  for (int i = tid; i < rows * (HD / 4); i += NTHREADS) {
    const int r = i / (HD / 4), c = (i % (HD / 4)) * 4;
    const float l = l_s[r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float4 v = *reinterpret_cast<const float4*>(Os + r * LDS + c);
    half2* dst = reinterpret_cast<half2*>(out + ((i64)(q_start + m0 + r) * num_q_heads + h) * HD + c);
    dst[0] = __floats2half2_rn(v.x * inv, v.y * inv);
    dst[1] = __floats2half2_rn(v.z * inv, v.w * inv);
  }
}
#else
// ---------------------------------------------------------------------------
// Alternative design (issue 17, point 3), selected with -DPREFILL_ALT; measured
// against the kernel above in docs/kernels.md.  Every warp computes all
// BM x CH score tiles over its own 512/NW slice of the head dimension (Q for
// that slice optionally register-resident, -DPREFILL_QREG=1), the NW partial
// S tiles are summed in shared memory by the softmax threads, and each warp
// owns 512/NW output columns for P V.  Knobs (all compile-time):
//   PREFILL_THREADS 256 | 512     PREFILL_BM 16 | 32 query rows
//   PREFILL_CHUNK 16 | 32 keys    PREFILL_MINB resident blocks per SM (launch bounds)
//   PREFILL_QREG 0 | 1            PREFILL_STAGE1 1 = one register staging buffer
//                                 (V(j) in flight during S, K(j+1) during P V)
// Shared memory (bytes) = [Q BM*LDS*2 unless QREG] + CH*LDS*2 + NW*BM*(CH+4)*4
//                         + BM*(CH+8)*2 + 2*BM*4; the launcher's grid uses BM rows.
// The output is scaled in registers and staged as fp16 (the accumulator's row and
// column per register learned once), so no fp32 BM x 512 staging is needed.
// ---------------------------------------------------------------------------
#ifndef PREFILL_THREADS
#define PREFILL_THREADS 256
#endif
#ifndef PREFILL_BM
#define PREFILL_BM 32
#endif
#ifndef PREFILL_CHUNK
#define PREFILL_CHUNK 32
#endif
#ifndef PREFILL_MINB
#define PREFILL_MINB 1
#endif
#ifndef PREFILL_QREG
#define PREFILL_QREG 1
#endif
#ifndef PREFILL_STAGE1
#define PREFILL_STAGE1 1
#endif

#define A_NT PREFILL_THREADS
#define A_BM PREFILL_BM
#define A_CH PREFILL_CHUNK
#define A_NW (A_NT / 32)
#define A_KS (HD / 16 / A_NW)       // k-steps of a warp's head-dim slice (S)
#define A_NF (HD / 16 / A_NW)       // output column tiles of a warp (P V)
#define A_MT (A_BM / 16)
#define A_NTL (A_CH / 16)
#define A_SLD (A_CH + 4)
#define A_PLD (A_CH + 8)
#define A_VECS (A_CH * VEC_PER_ROW / A_NT)
#define A_RPP (A_NT / VEC_PER_ROW)
#define A_TPR (A_NT / A_BM)          // softmax threads per row
#define A_CPT (A_CH / A_TPR)         // softmax columns per thread
static_assert(A_VECS >= 1 && A_CPT >= 1 && A_TPR <= 32, "prefill alt: tile shape");
static_assert(A_NW * A_KS * 16 == HD, "prefill alt: head-dim split");
#define A_KV_BYTES (A_CH * LDS * 2)
#define A_SP_BYTES (A_NW * A_BM * A_SLD * 4)
#if PREFILL_QREG
#define A_Q_BYTES 0
static_assert(A_BM * LDS * 2 <= A_KV_BYTES + A_SP_BYTES, "prefill alt: Q staging over K/V and S partials");
#else
#define A_Q_BYTES (A_BM * LDS * 2)
#endif
static_assert(A_BM * LDS * 2 <= A_Q_BYTES + A_KV_BYTES + A_SP_BYTES, "prefill alt: fp16 output staging");

__device__ __forceinline__ void a_offsets(i64 (&off)[A_VECS], const Pager& pg, int t0, int t_end) {
#pragma unroll
  for (int j = 0; j < A_VECS; ++j) {
    const int t = t0 + (int)threadIdx.x / VEC_PER_ROW + j * A_RPP;
    off[j] = t < t_end ? pg.offset(t) : -1;
  }
}

__device__ __forceinline__ void a_load(uint4 (&r)[A_VECS], const half* __restrict__ cache, const i64 (&off)[A_VECS]) {
  const int c = threadIdx.x % VEC_PER_ROW;
#pragma unroll
  for (int j = 0; j < A_VECS; ++j)
    r[j] = off[j] >= 0 ? __ldg(reinterpret_cast<const uint4*>(cache + off[j]) + c) : make_uint4(0u, 0u, 0u, 0u);
}

__device__ __forceinline__ void a_fetch(uint4 (&r)[A_VECS], const half* __restrict__ cache, const Pager& pg,
                                        int t0, int t_end) {
  i64 off[A_VECS];
  a_offsets(off, pg, t0, t_end);
  a_load(r, cache, off);
}

__device__ __forceinline__ void a_store(half* __restrict__ smem, const uint4 (&r)[A_VECS]) {
  const int row = threadIdx.x / VEC_PER_ROW, c = threadIdx.x % VEC_PER_ROW;
#pragma unroll
  for (int j = 0; j < A_VECS; ++j)
    *reinterpret_cast<uint4*>(smem + (row + j * A_RPP) * LDS + c * 8) = r[j];
}

extern "C" __global__ void __launch_bounds__(A_NT, PREFILL_MINB)
prefill_d512(half* __restrict__ out, const half* __restrict__ q, const half* __restrict__ k_cache,
             const half* __restrict__ v_cache, const int* __restrict__ block_tables,
             const int* __restrict__ cu_seqlens_q, const int* __restrict__ seq_lens,
             int num_q_heads, int num_kv_heads, int block_size, int max_blocks,
             i64 stride_block, i64 stride_token, i64 stride_head,
             float scale, int causal, int window, int kv_shared) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  half* KVs = reinterpret_cast<half*>(smem_raw + A_Q_BYTES);   // CH x LDS
#if PREFILL_QREG
  half* Qs = KVs;                                              // staging only, before the key loop
#else
  half* Qs = reinterpret_cast<half*>(smem_raw);                // BM x LDS
#endif
  float* Sp = reinterpret_cast<float*>(smem_raw + A_Q_BYTES + A_KV_BYTES);  // NW x BM x SLD
  half* Ps = reinterpret_cast<half*>(Sp + A_NW * A_BM * A_SLD);             // BM x PLD
  float* alpha_s = reinterpret_cast<float*>(Ps + A_BM * A_PLD);
  float* l_s = alpha_s + A_BM;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int b = blockIdx.y;
  const int h = blockIdx.z;
  const int kvh = h / (num_q_heads / num_kv_heads);
  const int q_start = cu_seqlens_q[b];
  const int q_len = cu_seqlens_q[b + 1] - q_start;
  const int m0 = (gridDim.x - 1 - blockIdx.x) * A_BM;  // longest causal rows first
  if (m0 >= q_len) return;
  const int kv_len = seq_lens[b];
  const int ctx = kv_len - q_len;
  const int rows = min(A_BM, q_len - m0);

  int k_end = kv_len;
  if (causal) k_end = min(kv_len, ctx + m0 + rows);
  int k_begin = 0;
  if (window > 0) k_begin = max(0, ctx + m0 - window + 1);

  fill_row_index(Sp);  // before the Q staging, which may overlap the S partials
  __syncthreads();
  const unsigned rowmap = learn_row_map(Sp);
  __syncthreads();
  for (int i = tid; i < A_BM * VEC_PER_ROW; i += A_NT) {
    const int r = i / VEC_PER_ROW, c = i % VEC_PER_ROW;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows) v = reinterpret_cast<const uint4*>(q + ((i64)(q_start + m0 + r) * num_q_heads + h) * HD)[c];
    *reinterpret_cast<uint4*>(Qs + r * LDS + c * 8) = v;
  }
  __syncthreads();
#if PREFILL_QREG
  frag_ab qa[A_MT][A_KS];
#pragma unroll
  for (int mt = 0; mt < A_MT; ++mt)
#pragma unroll
    for (int kk = 0; kk < A_KS; ++kk) sload_a_row(qa[mt][kk], Qs + mt * 16 * LDS + (warp * A_KS + kk) * 16, LDS);
#endif

  acc_frag o[A_MT][A_NF];
#pragma unroll
  for (int mt = 0; mt < A_MT; ++mt)
#pragma unroll
    for (int f = 0; f < A_NF; ++f) fill_acc(o[mt][f], 0.f);

  const float scale_log2 = scale * LOG2E;
  const int srow = tid / A_TPR;
  const int scol = (tid % A_TPR) * A_CPT;
  const int qpos = ctx + m0 + srow;
  float m_run = NEG_INF, l_run = 0.f;

  const Pager pg(block_tables, b, max_blocks, block_size, kvh, stride_block, stride_token, stride_head);
  uint4 kr[A_VECS];
#if !PREFILL_STAGE1
  uint4 vr[A_VECS];
  {
    i64 off[A_VECS];
    a_offsets(off, pg, k_begin, k_end);
    a_load(kr, k_cache, off);
    if (!kv_shared) a_load(vr, v_cache, off);
  }
#else
  a_fetch(kr, k_cache, pg, k_begin, k_end);
#endif

  for (int t0 = k_begin; t0 < k_end; t0 += A_CH) {
    const bool more = t0 + A_CH < k_end;
#if !PREFILL_STAGE1
    i64 off[A_VECS];
    if (more) a_offsets(off, pg, t0 + A_CH, k_end);
#endif
    __syncthreads();  // previous P V done with KVs / Ps / alpha_s (and Q staging read)
    a_store(KVs, kr);
    __syncthreads();
#if PREFILL_STAGE1
    if (!kv_shared) a_fetch(kr, v_cache, pg, t0, k_end);    // V(j) in flight during S
    else if (more) a_fetch(kr, k_cache, pg, t0 + A_CH, k_end);
#else
    if (more) a_load(kr, k_cache, off);
#endif

    {  // partial S over this warp's head-dim slice, all BM x CH tiles
      acc_frag s[A_MT][A_NTL];
#pragma unroll
      for (int mt = 0; mt < A_MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < A_NTL; ++nt) fill_acc(s[mt][nt], 0.f);
#pragma unroll
      for (int kk = 0; kk < A_KS; ++kk) {
        const int k0 = (warp * A_KS + kk) * 16;
#if !PREFILL_QREG
        frag_ab a[A_MT];
#pragma unroll
        for (int mt = 0; mt < A_MT; ++mt) sload_a_row(a[mt], Qs + mt * 16 * LDS + k0, LDS);
#endif
#pragma unroll
        for (int nt = 0; nt < A_NTL; ++nt) {
          frag_ab bk;
          sload_b_col(bk, KVs + nt * 16 * LDS + k0, LDS);
#pragma unroll
          for (int mt = 0; mt < A_MT; ++mt)
#if PREFILL_QREG
            mma_row_col(s[mt][nt], qa[mt][kk], bk);
#else
            mma_row_col(s[mt][nt], a[mt], bk);
#endif
        }
      }
#pragma unroll
      for (int mt = 0; mt < A_MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < A_NTL; ++nt)
          sstore_acc_row(Sp + warp * A_BM * A_SLD + mt * 16 * A_SLD + nt * 16, s[mt][nt], A_SLD);
    }
    __syncthreads();

    {  // online softmax: TPR threads per row, CPT columns each
      float sv[A_CPT];
#pragma unroll
      for (int j = 0; j < A_CPT; ++j) sv[j] = 0.f;
#pragma unroll
      for (int w = 0; w < A_NW; ++w) {
        const float* src = Sp + w * A_BM * A_SLD + srow * A_SLD + scol;
        if constexpr (A_CPT % 4 == 0) {
#pragma unroll
          for (int j = 0; j < A_CPT; j += 4) {
            const float4 v = *reinterpret_cast<const float4*>(src + j);
            sv[j] += v.x; sv[j + 1] += v.y; sv[j + 2] += v.z; sv[j + 3] += v.w;
          }
        } else {
#pragma unroll
          for (int j = 0; j < A_CPT; ++j) sv[j] += src[j];
        }
      }
      float mx = NEG_INF;
#pragma unroll
      for (int j = 0; j < A_CPT; ++j) {
        const int key = t0 + scol + j;
        bool ok = key < k_end;
        if (causal) ok = ok && key <= qpos;
        if (window > 0) ok = ok && (qpos - key) < window;
        sv[j] = ok ? sv[j] * scale_log2 : NEG_INF;
        mx = fmaxf(mx, sv[j]);
      }
      mx = warp_max_width(mx, A_TPR);
      const float m_new = fmaxf(m_run, mx);
      float alpha = 1.f, ps = 0.f;
      if (m_new != NEG_INF) {
#pragma unroll
        for (int j = 0; j < A_CPT; ++j) { sv[j] = exp2f(sv[j] - m_new); ps += sv[j]; }
        alpha = exp2f(m_run - m_new);
      } else {
#pragma unroll
        for (int j = 0; j < A_CPT; ++j) sv[j] = 0.f;
      }
      const float rs = warp_sum_width(ps, A_TPR);
      l_run = l_run * alpha + rs;
      m_run = m_new;
      if constexpr (A_CPT % 2 == 0) {
#pragma unroll
        for (int j = 0; j < A_CPT; j += 2)
          *reinterpret_cast<half2*>(Ps + srow * A_PLD + scol + j) = __floats2half2_rn(sv[j], sv[j + 1]);
      } else {
#pragma unroll
        for (int j = 0; j < A_CPT; ++j) Ps[srow * A_PLD + scol + j] = __float2half_rn(sv[j]);
      }
      if (tid % A_TPR == 0) alpha_s[srow] = alpha;
    }
    __syncthreads();  // all S reads of KVs done; P, alpha visible
    if (!kv_shared) {
#if PREFILL_STAGE1
      a_store(KVs, kr);
      __syncthreads();
      if (more) a_fetch(kr, k_cache, pg, t0 + A_CH, k_end);  // K(j+1) in flight during P V
#else
      a_store(KVs, vr);
      __syncthreads();
      if (more) a_load(vr, v_cache, off);
#endif
    }

    {  // O = O * alpha + P V
#pragma unroll
      for (int mt = 0; mt < A_MT; ++mt)
#pragma unroll
        for (int f = 0; f < A_NF; ++f)
#pragma unroll
          for (int i = 0; i < acc_frag::num_elements; ++i) o[mt][f].x[i] *= alpha_s[mt * 16 + row_of(rowmap, i)];
#pragma unroll
      for (int ks = 0; ks < A_NTL; ++ks) {
        frag_ab pa[A_MT];
#pragma unroll
        for (int mt = 0; mt < A_MT; ++mt) sload_a_row(pa[mt], Ps + mt * 16 * A_PLD + ks * 16, A_PLD);
#pragma unroll
        for (int f = 0; f < A_NF; ++f) {
          frag_ab bv;
          sload_b_row(bv, KVs + ks * 16 * LDS + (warp * A_NF + f) * 16, LDS);
#pragma unroll
          for (int mt = 0; mt < A_MT; ++mt) mma_row_row(o[mt][f], pa[mt], bv);
        }
      }
    }
  }

  // Epilogue: scale by 1/l in registers and write fp16 through shared memory.  The column of
  // each accumulator register is learned like its row (a matrix of column indices), so the
  // staging needs BM x LDS halves only, whatever the S-partial and Q regions hold.
  __syncthreads();
  if (tid % A_TPR == 0) l_s[srow] = l_run;
  for (int i = tid; i < 256; i += A_NT) Sp[i] = (float)(i & 15);
  __syncthreads();
  const unsigned colmap = learn_row_map(Sp);
  __syncthreads();
  half* Oh = reinterpret_cast<half*>(smem_raw);  // BM x LDS halves
#pragma unroll
  for (int mt = 0; mt < A_MT; ++mt) {
    float inv[acc_frag::num_elements];
#pragma unroll
    for (int i = 0; i < acc_frag::num_elements; ++i) {
      const float l = l_s[mt * 16 + row_of(rowmap, i)];
      inv[i] = l > 0.f ? 1.f / l : 0.f;
    }
#pragma unroll
    for (int f = 0; f < A_NF; ++f)
#pragma unroll
      for (int i = 0; i < acc_frag::num_elements; ++i)
        Oh[(mt * 16 + row_of(rowmap, i)) * LDS + (warp * A_NF + f) * 16 + row_of(colmap, i)] =
            __float2half_rn(o[mt][f].x[i] * inv[i]);
  }
  __syncthreads();
  for (int i = tid; i < rows * VEC_PER_ROW; i += A_NT) {
    const int r = i / VEC_PER_ROW, c = i % VEC_PER_ROW;
    reinterpret_cast<uint4*>(out + ((i64)(q_start + m0 + r) * num_q_heads + h) * HD)[c] =
        *reinterpret_cast<const uint4*>(Oh + r * LDS + c * 8);
  }
}
#endif
