/* backend/cpu/attn_tiled_body.h — the body of FAST mode's tiled prefill attention kernel, included once per ISA file after it defines TA_VL (lanes), TA_V and TA_MASK (vector and lane-mask types), the TA_* operations below, TA_JB1 / TA_JB2 (score blocks of one and two query vectors), TA_DV (PV block width in vectors) and TA_TILE (the name to give). No include guard: each inclusion is one variant. */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/attn_tiled.h"

#define TA_MAXQ (2 * TA_VL)
#define TA_MB 4 /* query rows of a PV block: divides every padded query count */
#define TA_JB_MAX (TA_JB1 > TA_JB2 ? TA_JB1 : TA_JB2)

#define TA_AI static inline __attribute__((always_inline))

/* Scores of positions [j0, j0 + JB) against the tile's mv query vectors:
 * s[j * mpad + m] = sum_d qt[d * mpad + m] * k_j[d], register-blocked as JB
 * positions x MV vectors of queries, one K element broadcast per FMA row. */
TA_AI void ta_scores_block(const float *qt, int mpad, const float *const *kp, int j0, int hd,
                           float *s, const int MV, const int JB)
{
    /* sized by constants, not by MV and JB: arrays of a parameter's size
     * are variable-length, which keeps them in memory even once inlined */
    TA_V acc[TA_JB_MAX][2];
    const float *k[TA_JB_MAX];
#pragma GCC unroll 16
    for (int jb = 0; jb < JB; jb++) {
        k[jb] = kp[j0 + jb];
#pragma GCC unroll 2
        for (int v = 0; v < MV; v++)
            acc[jb][v] = TA_ZERO();
    }
    for (int d = 0; d < hd; d++) {
        TA_V q[2];
#pragma GCC unroll 2
        for (int v = 0; v < MV; v++)
            q[v] = TA_LOAD(qt + (size_t)d * mpad + v * TA_VL);
#pragma GCC unroll 16
        for (int jb = 0; jb < JB; jb++) {
            TA_V kb = TA_SET1(k[jb][d]);
#pragma GCC unroll 2
            for (int v = 0; v < MV; v++)
                acc[jb][v] = TA_FMA(q[v], kb, acc[jb][v]);
        }
    }
#pragma GCC unroll 16
    for (int jb = 0; jb < JB; jb++)
#pragma GCC unroll 2
        for (int v = 0; v < MV; v++)
            TA_STORE(s + (size_t)(j0 + jb) * mpad + v * TA_VL, acc[jb][v]);
}

static void ta_scores(const float *qt, int mv, const float *const *kp, int n, int hd, float *s)
{
    int mpad = mv * TA_VL, j = 0;
    if (mv == 1) {
        for (; j + TA_JB1 <= n; j += TA_JB1)
            ta_scores_block(qt, mpad, kp, j, hd, s, 1, TA_JB1);
        for (; j + 4 <= n; j += 4)
            ta_scores_block(qt, mpad, kp, j, hd, s, 1, 4);
        for (; j < n; j++)
            ta_scores_block(qt, mpad, kp, j, hd, s, 1, 1);
    } else {
        for (; j + TA_JB2 <= n; j += TA_JB2)
            ta_scores_block(qt, mpad, kp, j, hd, s, 2, TA_JB2);
        for (; j + 4 <= n; j += 4)
            ta_scores_block(qt, mpad, kp, j, hd, s, 2, 4);
        for (; j < n; j++)
            ta_scores_block(qt, mpad, kp, j, hd, s, 2, 1);
    }
}

/* o[m][d0 .. d0 + DV * TA_VL) = o * corr[m] + sum_j p[j * mpad + m] * v_j[d]
 * for the TA_MB queries from m0: the accumulators stay in registers over the
 * chunk's positions, one V load serving TA_MB queries. */
TA_AI void ta_pv_block(float *o, int hd, const float *p, int mpad, const float *const *vp, int n,
                       const float *corr, int m0, int d0, const int DV)
{
    TA_V acc[TA_MB][TA_DV]; /* sized by constants, as in ta_scores_block */
#pragma GCC unroll 4
    for (int mb = 0; mb < TA_MB; mb++) {
        TA_V c = TA_SET1(corr[m0 + mb]);
#pragma GCC unroll 4
        for (int dv = 0; dv < DV; dv++)
            acc[mb][dv] = TA_MUL(TA_LOAD(o + (size_t)(m0 + mb) * hd + d0 + dv * TA_VL), c);
    }
    for (int j = 0; j < n; j++) {
        TA_V v[TA_DV];
#pragma GCC unroll 4
        for (int dv = 0; dv < DV; dv++)
            v[dv] = TA_LOAD(vp[j] + d0 + dv * TA_VL);
#pragma GCC unroll 4
        for (int mb = 0; mb < TA_MB; mb++) {
            TA_V pb = TA_SET1(p[(size_t)j * mpad + m0 + mb]);
#pragma GCC unroll 4
            for (int dv = 0; dv < DV; dv++)
                acc[mb][dv] = TA_FMA(pb, v[dv], acc[mb][dv]);
        }
    }
#pragma GCC unroll 4
    for (int mb = 0; mb < TA_MB; mb++)
#pragma GCC unroll 4
        for (int dv = 0; dv < DV; dv++)
            TA_STORE(o + (size_t)(m0 + mb) * hd + d0 + dv * TA_VL, acc[mb][dv]);
}

static void ta_pv(float *o, int hd, const float *p, int mpad, const float *const *vp, int n,
                  const float *corr)
{
    int nvec = hd / TA_VL;
    for (int d = 0; d < nvec; d += TA_DV) {
        int dv = nvec - d < TA_DV ? nvec - d : TA_DV;
        for (int m0 = 0; m0 < mpad; m0 += TA_MB) {
            switch (dv) {
            case 1: ta_pv_block(o, hd, p, mpad, vp, n, corr, m0, d * TA_VL, 1); break;
#if TA_DV >= 2
            case 2: ta_pv_block(o, hd, p, mpad, vp, n, corr, m0, d * TA_VL, 2); break;
#endif
#if TA_DV >= 3
            case 3: ta_pv_block(o, hd, p, mpad, vp, n, corr, m0, d * TA_VL, 3); break;
#endif
#if TA_DV >= 4
            case 4: ta_pv_block(o, hd, p, mpad, vp, n, corr, m0, d * TA_VL, 4); break;
#endif
            }
        }
    }
}

/* The online softmax of one chunk, a vector of queries at a time: masked
 * scores (positions outside a query's [first, last]) become probability 0;
 * s is overwritten with the probabilities, corr receives each query's factor
 * for what it accumulated before, rmax and rsum are carried forward. */
static void ta_softmax(float *s, int mv, int n, int pos0, bool masked, const float *firstf,
                       const float *lastf, float *rmax, float *rsum, float *corr)
{
    int mpad = mv * TA_VL;
    const TA_V ninf = TA_SET1(-INFINITY);
    for (int v = 0; v < mv; v++) {
        float *sv = s + v * TA_VL;
        TA_V first = TA_LOAD(firstf + v * TA_VL), last = TA_LOAD(lastf + v * TA_VL);
        TA_V bmax = ninf;
        if (masked) {
            for (int j = 0; j < n; j++) {
                TA_MASK ok = TA_VALID(TA_SET1((float)(pos0 + j)), first, last);
                TA_V x = TA_SELECT(ok, TA_LOAD(sv + (size_t)j * mpad), ninf);
                TA_STORE(sv + (size_t)j * mpad, x);
                bmax = TA_MAX(bmax, x);
            }
        } else {
            for (int j = 0; j < n; j++)
                bmax = TA_MAX(bmax, TA_LOAD(sv + (size_t)j * mpad));
        }
        /* running maxima start at -FLT_MAX, so a query whose chunk is all
         * masked keeps a finite maximum and its factor stays exp(0) */
        TA_V old = TA_LOAD(rmax + v * TA_VL), nmax = TA_MAX(old, bmax);
        TA_V c = TA_EXP(TA_SUB(old, nmax));
        TA_V sum = TA_MUL(TA_LOAD(rsum + v * TA_VL), c);
        for (int j = 0; j < n; j++) {
            TA_V x = TA_LOAD(sv + (size_t)j * mpad);
            TA_V e = TA_EXP(TA_SUB(x, nmax));
            if (masked) /* the exp clamps its input, so -inf would give a denormal, not 0 */
                e = TA_SELECT(TA_VALID(TA_SET1((float)(pos0 + j)), first, last), e, TA_ZERO());
            sum = TA_ADD(sum, e);
            TA_STORE(sv + (size_t)j * mpad, e);
        }
        TA_STORE(rmax + v * TA_VL, nmax);
        TA_STORE(rsum + v * TA_VL, sum);
        TA_STORE(corr + v * TA_VL, c);
    }
}

/* The first position a query at last attends to. */
static inline int ta_first_pos(int last, int window)
{
    return window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
}

/* Head rows of an f16 cache widened to f32 (head_dim a multiple of 8), with F16C. */
static void ta_widen(float *dst, const uint16_t *src, int hd)
{
    for (int d = 0; d < hd; d += 8)
        _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + d))));
}

/* The tile over an f32 cache (kw and vw NULL), or over an f16 one whose
 * chunk rows are widened into kw and vw (TATTN_CHUNK x head_dim floats each)
 * before the kernels read them: a row serves every query of the tile, so
 * widening it once costs little beside them. */
static void ta_tile(const struct tattn_args *a, const struct tattn_tile *t, float *kw, float *vw)
{
    const struct kv_cache *kv = a->kv;
    const struct attn_span *sp = t->sp;
    const float *kc = kv->k, *vc = kv->v;
    const uint16_t *kh = kv->k, *vh = kv->v;
    int hd = kv->head_dim, R = t->n_rows, G = t->n_heads, M = R * G;
    int mv = (M + TA_VL - 1) / TA_VL, mpad = mv * TA_VL;
    size_t q_stride = (size_t)a->n_heads * hd;

    /* queries transposed (query index fastest) and pre-scaled, padded to whole vectors */
    float qt[TATTN_MAX_HEAD_DIM * TA_MAXQ] __attribute__((aligned(64)));
    float o[TA_MAXQ * TATTN_MAX_HEAD_DIM] __attribute__((aligned(64)));
    float s[TATTN_CHUNK * TA_MAXQ] __attribute__((aligned(64)));
    float firstf[TA_MAXQ] __attribute__((aligned(64))), lastf[TA_MAXQ] __attribute__((aligned(64)));
    float rmax[TA_MAXQ] __attribute__((aligned(64))), rsum[TA_MAXQ] __attribute__((aligned(64)));
    float corr[TA_MAXQ] __attribute__((aligned(64)));
    const float *kp[TATTN_CHUNK], *vp[TATTN_CHUNK];

    /* the first row's last position, and the last row's; one per row when fixed_last is set */
    const int rstep = a->fixed_last >= 0 ? 0 : 1;
    int last0 = a->fixed_last >= 0 ? a->fixed_last : sp->pos0 + (t->row0 - sp->row0);
    int last_end = last0 + rstep * (R - 1);
    for (int m = 0; m < mpad; m++) {
        /* query m is row m / G, head m % G: a row's heads side by side */
        int r = m < M ? m / G : R - 1;
        firstf[m] = (float)ta_first_pos(last0 + rstep * r, a->sliding_window);
        lastf[m] = (float)(last0 + rstep * r);
        rmax[m] = -FLT_MAX;
        rsum[m] = 0.0f;
        if (m < M) {
            const float *q = a->q + (size_t)(t->row0 + r) * q_stride + (size_t)(t->head0 + m % G) * hd;
            for (int d = 0; d < hd; d++)
                qt[(size_t)d * mpad + m] = q[d] * a->scale;
        } else {
            for (int d = 0; d < hd; d++)
                qt[(size_t)d * mpad + m] = 0.0f;
        }
    }
    memset(o, 0, (size_t)mpad * hd * sizeof(float));

    /* positions below the last row's first one, or past the first row's
     * last one, are outside some query's range: those chunks are masked */
    int lo = ta_first_pos(last0, a->sliding_window);
    int unmasked_from = ta_first_pos(last_end, a->sliding_window);
    size_t head_off = (size_t)t->kv_head * hd;
    for (int c0 = lo, n; c0 <= last_end; c0 += n) {
        n = last_end + 1 - c0 < TATTN_CHUNK ? last_end + 1 - c0 : TATTN_CHUNK;
        for (int j = 0; j < n; j++) {
            int pos = c0 + j;
            uint32_t block = sp->block_ids[pos / kv->block_size];
            size_t off = tattn_slot_offset(kv, a->layer, block, pos % kv->block_size) + head_off;
            if (kw) {
                ta_widen(kw + (size_t)j * hd, kh + off, hd);
                ta_widen(vw + (size_t)j * hd, vh + off, hd);
                kp[j] = kw + (size_t)j * hd;
                vp[j] = vw + (size_t)j * hd;
            } else {
                kp[j] = kc + off;
                vp[j] = vc + off;
            }
        }
        ta_scores(qt, mv, kp, n, hd, s);
        bool masked = c0 < unmasked_from || c0 + n - 1 > last0;
        ta_softmax(s, mv, n, c0, masked, firstf, lastf, rmax, rsum, corr);
        ta_pv(o, hd, s, mpad, vp, n, corr);
    }

    for (int m = 0; m < M; m++) {
        float *out = a->out + (size_t)(t->row0 + m / G) * q_stride + (size_t)(t->head0 + m % G) * hd;
        float inv = 1.0f / rsum[m];
        for (int d = 0; d < hd; d++)
            out[d] = o[(size_t)m * hd + d] * inv;
    }
}

void TA_TILE(const struct tattn_args *a, const struct tattn_tile *t)
{
    if (a->kv->dtype == DTYPE_F16) {
        float kw[TATTN_CHUNK * TATTN_MAX_HEAD_DIM] __attribute__((aligned(64)));
        float vw[TATTN_CHUNK * TATTN_MAX_HEAD_DIM] __attribute__((aligned(64)));
        ta_tile(a, t, kw, vw);
    } else {
        ta_tile(a, t, NULL, NULL);
    }
}
