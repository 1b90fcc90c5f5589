/* backend/cpu/attn_f16_body.h — the body of the f16 cache's group decode kernel, included once per ISA file after it defines HA_VL (lanes), HA_V (vector type), the HA_* operations below (HA_LOADH widens HA_VL f16 values, HA_REDUCE4 sums each of four vectors into the lanes of an __m128), HA_GB (heads of a register block), HA_DV (V vectors of a P·V block) and HA_GROUP (the name to give). No include guard: each inclusion is one variant. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/attn_f16.h"

#define HA_AI static inline __attribute__((always_inline))

/* s[g * HATTN_CHUNK + j] = q_g · k_j for the GB heads from q and the PB (4 or
 * 1) positions from j0: GB x PB accumulators across head_dim, one K vector
 * widened per position and dimension block and used by every head. */
HA_AI void ha_scores_block(const float *q, int hd, const uint16_t *const *kp, size_t off, int j0,
                           float *s, const int GB, const int PB)
{
    HA_V acc[HA_GB][4]; /* sized by constants: arrays of a parameter's size stay in memory */
#pragma GCC unroll 8
    for (int g = 0; g < GB; g++)
#pragma GCC unroll 4
        for (int p = 0; p < PB; p++)
            acc[g][p] = HA_ZERO();
    for (int d = 0; d < hd; d += HA_VL) {
#pragma GCC unroll 4
        for (int p = 0; p < PB; p++) {
            HA_V k = HA_LOADH(kp[j0 + p] + off + d);
#pragma GCC unroll 8
            for (int g = 0; g < GB; g++)
                acc[g][p] = HA_FMA(HA_LOAD(q + (size_t)g * hd + d), k, acc[g][p]);
        }
    }
    /* a lone position is summed as it would be among four, so a score never depends on
     * how many positions its chunk scores (rows of one item end at different positions) */
#pragma GCC unroll 8
    for (int g = 0; g < GB; g++) {
        if (PB == 4)
            _mm_storeu_ps(s + g * HATTN_CHUNK + j0,
                          HA_REDUCE4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]));
        else
            s[g * HATTN_CHUNK + j0] =
                _mm_cvtss_f32(HA_REDUCE4(acc[g][0], acc[g][0], acc[g][0], acc[g][0]));
    }
}

/* Rows the next chunk reads, asked of memory a few at a time while this chunk's are used (a
 * burst of a whole chunk's lines overruns the core's outstanding misses): rows[j] for j in
 * [j0, j1) below n, row_bytes each. Into L2, not L1: a chunk's K or V rows are 16-128 KB,
 * which in a 32-48 KB L1 evict the rows still in use (8 sequences at 2,048 positions of the
 * house model's shape, out of cache: 3.5 ms a step asked into L1, 1.5 into L2). */
struct ha_ahead {
    const uint16_t *const *rows;
    int n, row_bytes;
};

HA_AI void ha_prefetch(const struct ha_ahead *a, int j0, int j1)
{
    if (!a)
        return;
    for (int j = j0; j < j1 && j < a->n; j++)
        for (int b = 0; b < a->row_bytes; b += 64)
            _mm_prefetch((const char *)a->rows[j] + b, _MM_HINT_T1);
}

/* The n positions' scores for the GB heads from q: four positions a block, ahead's rows
 * asked for beside them. */
HA_AI void ha_scores_heads(const float *q, int hd, const uint16_t *const *kp, size_t off, int n,
                           float *s, const int GB, const struct ha_ahead *ahead)
{
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        ha_prefetch(ahead, j, j + 4);
        ha_scores_block(q, hd, kp, off, j, s, GB, 4);
    }
    for (; j < n; j++) {
        ha_prefetch(ahead, j, j + 1);
        ha_scores_block(q, hd, kp, off, j, s, GB, 1);
    }
    if (ahead) /* the rest of a longer next chunk */
        ha_prefetch(ahead, n, ahead->n);
}

static void ha_scores(const float *q, int n_heads, int hd, const uint16_t *const *kp, size_t off,
                      int n, float *s, const struct ha_ahead *ahead)
{
    for (int g = 0; g < n_heads; g += HA_GB) {
        const float *qg = q + (size_t)g * hd;
        float *sg = s + g * HATTN_CHUNK;
        const struct ha_ahead *a = g == 0 ? ahead : NULL;
        switch (n_heads - g < HA_GB ? n_heads - g : HA_GB) {
        case 1: ha_scores_heads(qg, hd, kp, off, n, sg, 1, a); break;
        case 2: ha_scores_heads(qg, hd, kp, off, n, sg, 2, a); break;
#if HA_GB >= 3
        case 3: ha_scores_heads(qg, hd, kp, off, n, sg, 3, a); break;
#endif
#if HA_GB >= 4
        case 4: ha_scores_heads(qg, hd, kp, off, n, sg, 4, a); break;
#endif
        }
    }
}

/* One chunk's online softmax for head g: s becomes exp(s - new max), and
 * the running maximum and sum are carried forward; returns the factor for
 * what the head accumulated before this chunk. */
static float ha_softmax(float *s, int n, float *rmax, float *rsum)
{
    HA_V vmax = HA_SET1(-FLT_MAX);
    int j = 0;
    for (; j + HA_VL <= n; j += HA_VL)
        vmax = HA_MAX(vmax, HA_LOAD(s + j));
    float bmax = HA_HMAX(vmax);
    for (; j < n; j++)
        bmax = s[j] > bmax ? s[j] : bmax;
    float nmax = bmax > *rmax ? bmax : *rmax;
    float corr = expf(*rmax - nmax); /* 0 on the first chunk: rmax starts at -FLT_MAX */
    HA_V shift = HA_SET1(nmax), vsum = HA_ZERO();
    for (j = 0; j + HA_VL <= n; j += HA_VL) {
        HA_V e = HA_EXP(HA_SUB(HA_LOAD(s + j), shift));
        HA_STORE(s + j, e);
        vsum = HA_ADD(vsum, e);
    }
    float sum = HA_HSUM(vsum);
    for (; j < n; j++) {
        s[j] = expf(s[j] - nmax);
        sum += s[j];
    }
    *rsum = *rsum * corr + sum;
    *rmax = nmax;
    return corr;
}

/* o_g[d0 .. d0 + DV * HA_VL) = o_g * corr[g] + sum_j p_g[j] v_j for the GB
 * heads from o, p and corr: the accumulators stay in registers across the
 * chunk's positions, each V vector widened once for the GB heads. */
HA_AI void ha_pv_block(float *o, int hd, const float *p, const uint16_t *const *vp, size_t off,
                       int n, const float *corr, int d0, const int GB, const int DV,
                       const struct ha_ahead *ahead)
{
    HA_V acc[HA_GB][HA_DV];
#pragma GCC unroll 8
    for (int g = 0; g < GB; g++) {
        HA_V c = HA_SET1(corr[g]);
#pragma GCC unroll 4
        for (int dv = 0; dv < DV; dv++)
            acc[g][dv] = HA_MUL(HA_LOAD(o + (size_t)g * hd + d0 + dv * HA_VL), c);
    }
    for (int j = 0; j < n; j++) {
        ha_prefetch(ahead, j, j + 1);
        HA_V pb[HA_GB];
#pragma GCC unroll 8
        for (int g = 0; g < GB; g++)
            pb[g] = HA_SET1(p[g * HATTN_CHUNK + j]);
#pragma GCC unroll 4
        for (int dv = 0; dv < DV; dv++) {
            HA_V v = HA_LOADH(vp[j] + off + d0 + dv * HA_VL);
#pragma GCC unroll 8
            for (int g = 0; g < GB; g++)
                acc[g][dv] = HA_FMA(pb[g], v, acc[g][dv]);
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < GB; g++)
#pragma GCC unroll 4
        for (int dv = 0; dv < DV; dv++)
            HA_STORE(o + (size_t)g * hd + d0 + dv * HA_VL, acc[g][dv]);
}

/* Every dimension block of the GB heads from o; ahead's rows asked for beside the first. */
HA_AI void ha_pv_heads(float *o, int hd, const float *p, const uint16_t *const *vp, size_t off,
                       int n, const float *corr, const int GB, const struct ha_ahead *ahead)
{
    int nvec = hd / HA_VL, d = 0;
    for (; d + HA_DV <= nvec; d += HA_DV)
        ha_pv_block(o, hd, p, vp, off, n, corr, d * HA_VL, GB, HA_DV, d == 0 ? ahead : NULL);
    for (; d < nvec; d++)
        ha_pv_block(o, hd, p, vp, off, n, corr, d * HA_VL, GB, 1, d == 0 ? ahead : NULL);
    if (ahead)
        ha_prefetch(ahead, n, ahead->n);
}

static void ha_pv(float *o, int n_heads, int hd, const float *p, const uint16_t *const *vp,
                  size_t off, int n, const float *corr, const struct ha_ahead *ahead)
{
    for (int g = 0; g < n_heads; g += HA_GB) {
        float *og = o + (size_t)g * hd;
        const float *pg = p + g * HATTN_CHUNK;
        const struct ha_ahead *a = g == 0 ? ahead : NULL;
        switch (n_heads - g < HA_GB ? n_heads - g : HA_GB) {
        case 1: ha_pv_heads(og, hd, pg, vp, off, n, corr + g, 1, a); break;
        case 2: ha_pv_heads(og, hd, pg, vp, off, n, corr + g, 2, a); break;
#if HA_GB >= 3
        case 3: ha_pv_heads(og, hd, pg, vp, off, n, corr + g, 3, a); break;
#endif
#if HA_GB >= 4
        case 4: ha_pv_heads(og, hd, pg, vp, off, n, corr + g, 4, a); break;
#endif
        }
    }
}

/* The rows of positions [c0, c0 + n) of the item's kv head into kp and vp. */
static void ha_chunk_rows(const struct tattn_args *a, const struct hattn_item *it, int c0, int n,
                          const uint16_t **kp, const uint16_t **vp)
{
    const struct kv_cache *kv = a->kv;
    const struct attn_span *sp = it->sp;
    const uint16_t *kc = kv->k, *vc = kv->v;
    int hd = kv->head_dim;
    size_t head_off = (size_t)it->kv_head * hd;
    for (int j = 0; j < n; j++) {
        int pos = c0 + j;
        uint32_t block = sp->block_ids[pos / kv->block_size];
        size_t off = tattn_slot_offset(kv, a->layer, block, pos % kv->block_size) + head_off;
        kp[j] = kc + off;
        vp[j] = vc + off;
    }
}

/* The item's rows, which share their first position: each chunk of positions
 * is scored and its V rows added for every row at once; a row's scores past
 * its own last position are left out of its softmax and weigh exactly zero. */
static void ha_rows(const struct tattn_args *a, const struct hattn_item *it, int first)
{
    const struct kv_cache *kv = a->kv;
    const struct attn_span *sp = it->sp;
    int hd = kv->head_dim, G = it->n_heads, R = it->n_rows, NK = hattn_item_kv_heads(it);
    int KG = NK * G, Q = R * KG; /* a row's heads, every row's */
    size_t q_stride = (size_t)a->n_heads * hd;
    int last0 = sp->pos0 + (it->row - sp->row0), last = last0 + R - 1;

    float q[HATTN_MAX_QUERY_FLOATS] __attribute__((aligned(64)));
    float o[HATTN_MAX_QUERY_FLOATS] __attribute__((aligned(64)));
    float s[HATTN_MAX_HEADS * HATTN_CHUNK] __attribute__((aligned(64)));
    float rmax[HATTN_MAX_HEADS], rsum[HATTN_MAX_HEADS], corr[HATTN_MAX_HEADS];
    const uint16_t *kp[2][HATTN_CHUNK], *vp[2][HATTN_CHUNK]; /* this chunk's rows and the next's */

    for (int r = 0; r < R; r++) {
        const float *qrow = a->q + (size_t)(it->row + r) * q_stride + (size_t)it->head0 * hd;
        for (int i = 0; i < KG * hd; i++)
            q[(size_t)r * KG * hd + i] = qrow[i] * a->scale;
    }
    memset(o, 0, (size_t)Q * hd * sizeof(float));
    for (int g = 0; g < Q; g++) {
        rmax[g] = -FLT_MAX;
        rsum[g] = 0.0f;
    }

    int n = last + 1 - first < HATTN_CHUNK ? last + 1 - first : HATTN_CHUNK, cur = 0;
    int row_bytes = hd * 2 * NK; /* an item's part of a slot row */
    ha_chunk_rows(a, it, first, n, kp[0], vp[0]);
    {
        const struct ha_ahead k0 = {kp[0], n, row_bytes}, v0 = {vp[0], n, row_bytes};
        ha_prefetch(&k0, 0, n);
        ha_prefetch(&v0, 0, n);
    }
    for (int c0 = first; n > 0; cur ^= 1) {
        /* the next chunk's rows are asked for as this one's are used: K's beside the scores,
         * V's beside P V */
        int next = c0 + n, n_next = last + 1 - next < HATTN_CHUNK ? last + 1 - next : HATTN_CHUNK;
        if (n_next > 0)
            ha_chunk_rows(a, it, next, n_next, kp[cur ^ 1], vp[cur ^ 1]);
        const struct ha_ahead k_ahead = {kp[cur ^ 1], n_next, row_bytes},
                              v_ahead = {vp[cur ^ 1], n_next, row_bytes};
        /* the heads of kv head k (its part of each slot row, k * hd along) row by row; with
         * one kv head every row's heads in one call */
        for (int rk = 0; rk < (NK > 1 ? R * NK : 1); rk++)
            ha_scores(q + (size_t)rk * G * hd, NK > 1 ? G : Q, hd, kp[cur],
                      (size_t)(rk % NK) * hd, n, s + rk * G * HATTN_CHUNK,
                      rk == 0 && n_next > 0 ? &k_ahead : NULL);
        for (int r = 0; r < R; r++) {
            int own = last0 + r + 1 - c0; /* the row's positions in this chunk */
            own = own < 0 ? 0 : own < n ? own : n;
            for (int g = r * KG; g < (r + 1) * KG; g++) {
                float *sg = s + g * HATTN_CHUNK;
                corr[g] = own > 0 ? ha_softmax(sg, own, &rmax[g], &rsum[g]) : 1.0f;
                for (int j = own; j < n; j++)
                    sg[j] = 0.0f;
            }
        }
        for (int rk = 0; rk < (NK > 1 ? R * NK : 1); rk++)
            ha_pv(o + (size_t)rk * G * hd, NK > 1 ? G : Q, hd, s + rk * G * HATTN_CHUNK, vp[cur],
                  (size_t)(rk % NK) * hd, n, corr + rk * G,
                  rk == 0 && n_next > 0 ? &v_ahead : NULL);
        c0 = next;
        n = n_next;
    }

    for (int r = 0; r < R; r++) {
        float *out = a->out + (size_t)(it->row + r) * q_stride + (size_t)it->head0 * hd;
        for (int g = 0; g < KG; g++) {
            int qi = r * KG + g;
            float inv = 1.0f / rsum[qi];
            for (int d = 0; d < hd; d++)
                out[(size_t)g * hd + d] = o[(size_t)qi * hd + d] * inv;
        }
    }
}

void HA_GROUP(const struct tattn_args *a, const struct hattn_item *it)
{
    const struct attn_span *sp = it->sp;
    int w = a->sliding_window, last0 = sp->pos0 + (it->row - sp->row0);
    int lastr = last0 + it->n_rows - 1;
    /* a sliding window moves each row's first position: then the rows one at a time */
    bool together = w <= 0 || lastr - w + 1 <= 0;
    for (int r = 0; r < (together ? 1 : it->n_rows); r++) {
        struct hattn_item one = *it;
        if (!together) {
            one.row = it->row + r;
            one.n_rows = 1;
        }
        int last = last0 + r;
        ha_rows(a, &one, w > 0 && last - w + 1 > 0 ? last - w + 1 : 0);
    }
}
