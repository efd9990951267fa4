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
// shared memory uses the .shared state space (below).
#include "d512_common.cuh"

#define NTHREADS 512
#define BM 32
#define SLD 36
#define PLD 40
typedef Tile<NTHREADS> PT;

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

  const Pager pg(block_tables, b, max_blocks, block_size, kvh, stride_block, stride_token, stride_head);
  uint4 kr[PT::VECS], vr[PT::VECS];
  {
    i64 off[PT::VECS];
    chunk_offsets<NTHREADS>(off, pg, k_begin, k_end);
    load_chunk<NTHREADS>(kr, k_cache, off);
    if (!kv_shared) load_chunk<NTHREADS>(vr, v_cache, off);
  }

  for (int t0 = k_begin; t0 < k_end; t0 += CHUNK) {
    const bool more = t0 + CHUNK < k_end;
    i64 off[PT::VECS];
    if (more) chunk_offsets<NTHREADS>(off, pg, t0 + CHUNK, k_end);
    __syncthreads();  // previous P V done with KVs / Ps / alpha_s
    store_chunk<NTHREADS>(KVs, kr);
    __syncthreads();
    if (more) load_chunk<NTHREADS>(kr, k_cache, off);

    {  // S partials: tile (mt, nt), head-dim quarter kq
      const int mt = warp & 1, nt = (warp >> 1) & 1, kq = warp >> 2;
      frag_ab a, bk;
      acc_frag s;
      fill_acc(s, 0.f);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const int k0 = (kq * 8 + kk) * 16;
        sload_a_row(a, Qs + mt * 16 * LDS + k0, LDS);
        sload_b_col(bk, KVs + nt * 16 * LDS + k0, LDS);
        mma_row_col(s, a, bk);
      }
      sstore_acc_row(Sp + kq * BM * SLD + mt * 16 * SLD + nt * 16, s, SLD);
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
    }
    __syncthreads();  // all S reads of KVs done; P, alpha visible
    if (!kv_shared) {
      store_chunk<NTHREADS>(KVs, vr);
      __syncthreads();
      if (more) load_chunk<NTHREADS>(vr, v_cache, off);
    }

    {  // O = O * alpha + P V
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int f = 0; f < 2; ++f)
#pragma unroll
          for (int i = 0; i < acc_frag::num_elements; ++i) o[mt][f].x[i] *= alpha_s[mt * 16 + row_of(rowmap, i)];
      frag_ab a[2], bv;
#pragma unroll
      for (int ks = 0; ks < CHUNK / 16; ++ks) {
        sload_a_row(a[0], Ps + ks * 16, PLD);
        sload_a_row(a[1], Ps + 16 * PLD + ks * 16, PLD);
#pragma unroll
        for (int f = 0; f < 2; ++f) {
          sload_b_row(bv, KVs + ks * 16 * LDS + warp * 32 + f * 16, LDS);
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
