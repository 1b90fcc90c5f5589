/* backend/cuda/online_softmax.cuh — the online softmax the attention kernels share: a row's running max and sum, the accumulator rescaled as the max grows, partial results merged and normalised. */
#ifndef INFERD_BACKEND_CUDA_ONLINE_SOFTMAX_CUH
#define INFERD_BACKEND_CUDA_ONLINE_SOFTMAX_CUH

#include <float.h>

/* Each helper performs the floating-point operations of the kernel code it
 * replaced, in the same order, so the kernels' results are the same bits as
 * before (EXACT mode's batch invariance and the CUDA parity tests rest on
 * them): a change here changes every caller's results.
 *
 * A row's state is (m, l, acc): m the largest score seen, l = sum_p e^(s_p - m)
 * and acc = sum_p e^(s_p - m) v_p over the positions p seen; its output is
 * acc / l. */

/* An empty row: nothing seen yet. */
template <int N>
static __device__ __forceinline__ void osm_init(float (&acc)[N], float &m, float &l)
{
#pragma unroll
    for (int j = 0; j < N; j++)
        acc[j] = 0.0f;
    m = -FLT_MAX;
    l = 0.0f;
}

/* ---- one score at a time (the decode kernels) --------------------------- */

/* Score s (scaled) of a position whose V elements this thread holds in v
 * joins the row: m grows to max(m, s), the old l and acc are rescaled by
 * corr = e^(m_old - m), and e^(s - m) is added to l and e^(s - m) v to acc
 * (one fmaf per element: acc * corr + p v). */
template <int N>
static __device__ __forceinline__ void osm_add_score(float s, const float (&v)[N], float &m,
                                                     float &l, float (&acc)[N])
{
    float m_new = fmaxf(m, s);
    float corr = expf(m - m_new), pr = expf(s - m_new);
    l = l * corr + pr;
#pragma unroll
    for (int j = 0; j < N; j++)
        acc[j] = fmaf(acc[j], corr, pr * v[j]);
    m = m_new;
}

/* ---- partial states merged (warps of a block, splits of a row) ---------- */

/* The largest of n partial maxima m[i * stride], from -FLT_MAX. */
static __device__ __forceinline__ float osm_max(int n, const float *m, int stride)
{
    float M = -FLT_MAX;
    for (int i = 0; i < n; i++)
        M = fmaxf(M, m[i * stride]);
    return M;
}

/* One element of n partial states merged against their largest max M
 * (osm_max): *L = sum_i l_i e^(m_i - M) and *A = sum_i a_i e^(m_i - M), summed
 * in order i = 0 .. n - 1. m_i and l_i at m[i * ml_stride] and
 * l[i * ml_stride], a_i at a[i * a_stride]. The output element is *A / *L. */
static __device__ __forceinline__ void osm_merge(int n, const float *m, const float *l,
                                                 int ml_stride, const float *a, int a_stride,
                                                 float M, float *L, float *A)
{
    float sum = 0.0f, acc = 0.0f;
    for (int i = 0; i < n; i++) {
        float e = expf(m[i * ml_stride] - M);
        sum += l[i * ml_stride] * e;
        acc += a[i * a_stride] * e;
    }
    *L = sum;
    *A = acc;
}

/* ---- quads: four lanes (4k .. 4k + 3) that share a query row ------------ */

static __device__ __forceinline__ float osm_quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    return v;
}

static __device__ __forceinline__ float osm_quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

/* The positions of a prefill tile's rows (nq query rows of a span from span
 * row q0, the span's first at position pos0) and of the quad's row r among
 * them: the row sits at my_pos and attends to [my_first, my_pos] (window > 0:
 * the last window positions); the tile's rows together attend to
 * [first_pos, last_pos]. A row r >= nq (past the span) computes but is not
 * valid: it attends to nothing and stores nothing. */
struct osm_quad_rows {
    int my_pos, my_first, first_pos, last_pos;
    bool row_valid;
};

static __device__ __forceinline__ struct osm_quad_rows osm_quad_rows_at(int pos0, int q0, int nq,
                                                                        int r, int window)
{
    struct osm_quad_rows w;
    w.my_pos = pos0 + q0 + r;
    w.row_valid = r < nq;
    w.my_first = 0;
    if (window > 0 && w.my_pos - window + 1 > 0)
        w.my_first = w.my_pos - window + 1;
    w.last_pos = pos0 + q0 + nq - 1;
    w.first_pos = 0;
    if (window > 0 && pos0 + q0 - window + 1 > 0)
        w.first_pos = pos0 + q0 - window + 1;
    return w;
}

/* The f32 tiled prefill kernels (attention.cu, attention_quant.cu): a quad
 * owns query row r of a tile, lane sub = 0..3 of it holding the tile's key
 * columns and head dims sub, sub + 4, ...; q (shared, row r at q_row, hd
 * floats) is already scaled, k holds the tile's BK keys (row c at k + c * ldk).
 * s[j] is the score of column sub + 4 j, -FLT_MAX where position k0 + column
 * is outside [first, last] or the row is not valid; the return is the lane's
 * largest unmasked score (-FLT_MAX when none). */
template <int BK>
static __device__ __forceinline__ float osm_quad_scores(float (&s)[BK / 4], const float *q_row,
                                                        const float *k, int ldk, int hd, int sub,
                                                        int k0, bool row_valid, int first,
                                                        int last)
{
    float tile_max = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < BK / 4; j++) {
        int c = sub + 4 * j;
        int p = k0 + c;
        float dot = 0.0f;
        for (int d = 0; d < hd; d++)
            dot = fmaf(q_row[d], k[c * ldk + d], dot);
        bool ok = row_valid && p <= last && p >= first;
        s[j] = ok ? dot : -FLT_MAX;
        if (ok)
            tile_max = fmaxf(tile_max, dot);
    }
    return tile_max;
}

/* The tile's scores (osm_quad_scores) join the quad's row: the tile's max
 * and sum are reduced over the quad, the probabilities go through p_row (the
 * row's BK floats of shared memory) so that each lane can weigh every V row
 * of the tile (v: BK x hd) into its head dims of acc. */
template <int BK, int HPT>
static __device__ __forceinline__ void osm_quad_tile(const float (&s)[BK / 4], float tile_max,
                                                     float *p_row, const float *v, int hd,
                                                     int sub, float &m, float &l,
                                                     float (&acc)[HPT])
{
    tile_max = osm_quad_max(tile_max);
    float m_new = fmaxf(m, tile_max);
    float corr = expf(m - m_new);
    float rowsum = 0.0f;
#pragma unroll
    for (int j = 0; j < BK / 4; j++) {
        float pr = s[j] == -FLT_MAX ? 0.0f : expf(s[j] - m_new);
        p_row[sub + 4 * j] = pr;
        rowsum += pr;
    }
    rowsum = osm_quad_sum(rowsum);
    l = l * corr + rowsum;
    m = m_new;
    __syncwarp();
#pragma unroll
    for (int j = 0; j < HPT; j++)
        acc[j] *= corr;
    for (int c = 0; c < BK; c++) {
        float pr = p_row[c];
#pragma unroll
        for (int j = 0; j < HPT; j++) {
            int d = sub + 4 * j;
            if (d < hd)
                acc[j] = fmaf(pr, v[c * hd + d], acc[j]);
        }
    }
}

/* The quad's row written out: out[d] = acc / l for this lane's head dims. */
template <int HPT>
static __device__ __forceinline__ void osm_quad_store(const float (&acc)[HPT], float l, float *out,
                                                      int hd, int sub)
{
    float inv = 1.0f / l;
#pragma unroll
    for (int j = 0; j < HPT; j++) {
        int d = sub + 4 * j;
        if (d < hd)
            out[d] = acc[j] * inv;
    }
}

#endif
