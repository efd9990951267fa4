// Paged decode attention, head_dim 512, fp16 in/out, fp32 accumulation.
//
// One block = one sequence x one KV head x (up to 16 query heads of that KV
// head's GQA group, packed as the 16 rows of the WMMA tiles) x one split of
// the context.  The key range of the sequence is cut into `num_splits` pieces
// so that a small batch still fills the GPU; split results (unnormalised
// output, running max, running sum) go to a workspace and
// `paged_decode_d512_reduce` merges them.  With num_splits == 1 the kernel
// writes the normalised fp16 output itself.
//
// Pipeline per 32-key chunk: registers -> shared K/V, S = Q K^T on tensor
// cores (4-way split over the head dimension, 2 column tiles), online softmax
// on 256 threads, O = O * alpha + P V on tensor cores; the next chunk's global
// loads are in flight while the current chunk is computed.
//
// Shared memory (bytes): Q 16x520 halves 16640, K 32x520 33280, V 33280,
// S partials 4x16x36 floats 9216, P 16x40 halves 1280, row stats 192
// = 93888 (< 96 KB, Volta's opt-in limit).
#include "d512_common.cuh"

#define NTHREADS 256
typedef Tile<NTHREADS> DT;

#define QROWS 16
// One block per SM lets the compiler keep the next chunk's K/V (64 registers)
// and the output tiles without spilling.  -DDECODE_MIN_BLOCKS=2 caps registers
// at 128 so that two blocks share an SM where shared memory allows it (sm_80+);
// on an H200 that measured slower (54.6 % vs 60.9 % of peak at batch 32 x 32K).
#ifndef DECODE_MIN_BLOCKS
#define DECODE_MIN_BLOCKS 1
#endif
#define SLD 36
#define PLD 40
// Every WMMA access to shared memory names the .shared state space (as in the
// prefill): 1-8 % faster than generic addresses on the H200, and 192 instead of
// 255 registers for sm_70 (docs/kernels.md, 2026-11-30).

// Most splits the reduce kernel merges (its shared weight table).
#define MAX_SPLITS 256

extern "C" __global__ void __launch_bounds__(NTHREADS, DECODE_MIN_BLOCKS)
paged_decode_d512(half* __restrict__ out,            // [num_seqs, num_q_heads, 512]
                  float* __restrict__ part_o,        // [num_splits, num_seqs, num_q_heads, 512]
                  float* __restrict__ part_ml,       // [num_splits, num_seqs, num_q_heads, 2]
                  const half* __restrict__ q,        // [num_seqs, num_q_heads, 512]
                  const half* __restrict__ k_cache,
                  const half* __restrict__ v_cache,
                  const int* __restrict__ block_tables,  // [num_seqs, max_blocks]
                  const int* __restrict__ seq_lens,      // [num_seqs]
                  int num_seqs, int num_q_heads, int num_kv_heads, int block_size, int max_blocks,
                  i64 stride_block, i64 stride_token, i64 stride_head,
                  float scale, int window, int num_splits, int kv_shared) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  half* Ks = reinterpret_cast<half*>(smem_raw);            // CHUNK x LDS, later O staging (16 x LDS fp32)
  half* Vs = Ks + CHUNK * LDS;                              // CHUNK x LDS
  half* Qs = Vs + CHUNK * LDS;                              // QROWS x LDS
  float* Sp = reinterpret_cast<float*>(Qs + QROWS * LDS);  // 4 x QROWS x SLD
  half* Ps = reinterpret_cast<half*>(Sp + 4 * QROWS * SLD);// QROWS x PLD
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
  for (int i = tid; i < QROWS * VEC_PER_ROW; i += NTHREADS) {
    const int r = i / VEC_PER_ROW, c = i % VEC_PER_ROW;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < nrows) v = reinterpret_cast<const uint4*>(q + ((i64)b * num_q_heads + qh0 + r) * HD)[c];
    *reinterpret_cast<uint4*>(Qs + r * LDS + c * 8) = v;
  }
  fill_row_index(Sp);
  __syncthreads();
  const unsigned rowmap = learn_row_map(Sp);

  acc_frag o[4];
#pragma unroll
  for (int f = 0; f < 4; ++f) fill_acc(o[f], 0.f);

  const float scale_log2 = scale * LOG2E;
  float m_run = NEG_INF, l_run = 0.f;  // row stats, identical in the 16 threads of a row
  const int srow = tid >> 4;
  const int scol = (tid & 15) * 2;

  const Pager pg(block_tables, b, max_blocks, block_size, kvh, stride_block, stride_token, stride_head);
  uint4 kr[DT::VECS], vr[DT::VECS];
  {
    i64 off[DT::VECS];
    chunk_offsets<NTHREADS>(off, pg, ts, te);
    load_chunk<NTHREADS>(kr, k_cache, off);
    if (!kv_shared) load_chunk<NTHREADS>(vr, v_cache, off);
  }

  for (int t0 = ts; t0 < te; t0 += CHUNK) {
    __syncthreads();  // previous chunk finished with Ks/Vs/Ps (and the row map scratch)
    store_chunk<NTHREADS>(Ks, kr);
    if (!kv_shared) store_chunk<NTHREADS>(Vs, vr);
    __syncthreads();
    if (t0 + CHUNK < te) {
      i64 off[DT::VECS];
      chunk_offsets<NTHREADS>(off, pg, t0 + CHUNK, te);
      load_chunk<NTHREADS>(kr, k_cache, off);
      if (!kv_shared) load_chunk<NTHREADS>(vr, v_cache, off);
    }

    // S partial = Q[:, kq*128 : kq*128+128] K^T for column tile nt.
    {
      const int nt = warp & 1, kq = warp >> 1;
      frag_ab a;
      frag_ab bk;
      acc_frag s;
      fill_acc(s, 0.f);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const int k0 = (kq * 8 + kk) * 16;
        sload_a_row(a, Qs + k0, LDS);
        sload_b_col(bk, Ks + nt * 16 * LDS + k0, LDS);
        mma_row_col(s, a, bk);
      }
      sstore_acc_row(Sp + kq * QROWS * SLD + nt * 16, s, SLD);
    }
    __syncthreads();

    // Online softmax: 16 rows x 32 columns, 16 threads per row, 2 columns each.
    {
      float s2[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = scol + j;
        float v = Sp[srow * SLD + c] + Sp[(QROWS + srow) * SLD + c] + Sp[(2 * QROWS + srow) * SLD + c] +
                  Sp[(3 * QROWS + srow) * SLD + c];
        s2[j] = (t0 + c < te) ? v * scale_log2 : NEG_INF;
      }
      const float mx = warp_max_width(fmaxf(s2[0], s2[1]), 16);
      const float m_new = fmaxf(m_run, mx);  // finite: every chunk holds a valid key
      const float p0 = exp2f(s2[0] - m_new), p1 = exp2f(s2[1] - m_new);
      const float rs = warp_sum_width(p0 + p1, 16);
      const float alpha = exp2f(m_run - m_new);
      l_run = l_run * alpha + rs;
      m_run = m_new;
      *reinterpret_cast<half2*>(Ps + srow * PLD + scol) = __floats2half2_rn(p0, p1);
      if ((tid & 15) == 0) alpha_s[srow] = alpha;
    }
    __syncthreads();

    // O = O * alpha + P V for this warp's 64 output columns.
    {
#pragma unroll
      for (int f = 0; f < 4; ++f)
#pragma unroll
        for (int i = 0; i < acc_frag::num_elements; ++i) o[f].x[i] *= alpha_s[row_of(rowmap, i)];
      frag_ab a;
      frag_ab bv;
#pragma unroll
      for (int ks = 0; ks < CHUNK / 16; ++ks) {
        sload_a_row(a, Ps + ks * 16, PLD);
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          sload_b_row(bv, Vs + ks * 16 * LDS + warp * 64 + f * 16, LDS);
          mma_row_row(o[f], a, bv);
        }
      }
    }
  }

  // Stage O (fp32, 16 x LDS) over Ks and write it out.
  __syncthreads();
  if ((tid & 15) == 0) {
    m_s[srow] = m_run;
    l_s[srow] = l_run;
  }
  float* Os = reinterpret_cast<float*>(Ks);
#pragma unroll
  for (int f = 0; f < 4; ++f) sstore_acc_row(Os + warp * 64 + f * 16, o[f], LDS);
  __syncthreads();

  if (num_splits == 1) {
    for (int i = tid; i < nrows * (HD / 4); i += NTHREADS) {
      const int r = i / (HD / 4), c = (i % (HD / 4)) * 4;
      const float inv = 1.f / l_s[r];
      const float4 v = *reinterpret_cast<const float4*>(Os + r * LDS + c);
      half2* dst = reinterpret_cast<half2*>(out + ((i64)b * num_q_heads + qh0 + r) * HD + c);
      dst[0] = __floats2half2_rn(v.x * inv, v.y * inv);
      dst[1] = __floats2half2_rn(v.z * inv, v.w * inv);
    }
  } else {
    for (int i = tid; i < nrows * (HD / 4); i += NTHREADS) {
      const int r = i / (HD / 4), c = (i % (HD / 4)) * 4;
      *reinterpret_cast<float4*>(part_o + (((i64)split * num_seqs + b) * num_q_heads + qh0 + r) * HD + c) =
          *reinterpret_cast<const float4*>(Os + r * LDS + c);
    }
    if (tid < nrows) {
      float* ml = part_ml + (((i64)split * num_seqs + b) * num_q_heads + qh0 + tid) * 2;
      ml[0] = m_s[tid];
      ml[1] = l_s[tid];
    }
  }
}

// Merge split results: out = sum_s 2^(m_s - M) O_s / sum_s 2^(m_s - M) l_s.
// Grid (num_q_heads, num_seqs, HD / 128): a block merges 128 columns of one
// row, one column per thread, so a small batch still spreads the merge over
// many SMs.  The split weights are computed once per block into shared memory
// (threads over splits); then every thread streams its column of all splits
// (coalesced 512-byte rows, independent loads in flight).  num_splits <=
// MAX_SPLITS (the launcher checks).
#define MERGE_COLS 128
extern "C" __global__ void __launch_bounds__(MERGE_COLS)
paged_decode_d512_reduce(half* __restrict__ out, const float* __restrict__ part_o,
                         const float* __restrict__ part_ml, int num_seqs, int num_q_heads, int num_splits) {
  __shared__ float w_s[MAX_SPLITS];
  __shared__ float red[MERGE_COLS / 32];
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int c = blockIdx.z * MERGE_COLS + tid;
  const i64 row0 = (i64)b * num_q_heads + h, step = (i64)num_seqs * num_q_heads;
  float mloc = NEG_INF;
  for (int s = tid; s < num_splits; s += MERGE_COLS) mloc = fmaxf(mloc, part_ml[(row0 + s * step) * 2]);
  mloc = warp_max_width(mloc, 32);
  if ((tid & 31) == 0) red[tid >> 5] = mloc;
  __syncthreads();
  const float M = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
  __syncthreads();
  float dloc = 0.f;
  for (int s = tid; s < num_splits; s += MERGE_COLS) {
    const float l = part_ml[(row0 + s * step) * 2 + 1];
    const float w = l == 0.f ? 0.f : exp2f(part_ml[(row0 + s * step) * 2] - M);  // empty split: weight 0
    w_s[s] = w;
    dloc += w * l;
  }
  dloc = warp_sum_width(dloc, 32);
  if ((tid & 31) == 0) red[tid >> 5] = dloc;
  __syncthreads();
  const float inv = 1.f / (red[0] + red[1] + red[2] + red[3]);
  float acc = 0.f;
#pragma unroll 8
  for (int s = 0; s < num_splits; ++s) acc += w_s[s] * part_o[(row0 + s * step) * HD + c];
  out[row0 * HD + c] = __float2half_rn(acc * inv);
}
