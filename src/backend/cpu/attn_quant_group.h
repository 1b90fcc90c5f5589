/* backend/cpu/attn_quant_group.h — the body of quantized attention's row kernel, included once per ISA file after it defines QA_DECODE_RECORD, QA_DECODE_SIGNS, QA_DOT, QA_ROW_MAX, QA_ROW_EXP (its record decoders, dot product and softmax rows), QA_V and the QA_V_* operations on sixteen floats, QA_QK_HEADS and QA_PV_SLICES (its register blocking), QA_GROUP and QA_ROWS (the names to give). No include guard: each inclusion is one variant. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/attn_quant_kernels.h"
#include "backend/kv_quant.h"

#define QA_TILE 16 /* positions whose records are decoded into rows of floats at a time */
#define QA_AI static inline __attribute__((always_inline))

/* s[g][j0 + p] = scale * (q_g . rows[j0 + p]) for the GB heads from q and four rows (p < 4):
 * each sum QA_DOT's, the same products added in the same order, the four positions' horizontal
 * sums reduced together; the sums stay in registers across head_dim. */
QA_AI void qa_scores4(const float (*q)[QATTN_MAX_HEAD_DIM], int hd,
                      const float (*rows)[QATTN_MAX_HEAD_DIM], int j0, float scale,
                      float (*s)[QATTN_MAX_BLOCK], int s0, const int GB)
{
    QA_V acc[QA_QK_HEADS][4];
#pragma GCC unroll 4
    for (int g = 0; g < GB; g++)
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            acc[g][p] = QA_V_ZERO();
    for (int d = 0; d < hd; d += 16) {
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            QA_V k = QA_V_LOAD(rows[j0 + p] + d);
#pragma GCC unroll 4
            for (int g = 0; g < GB; g++)
                acc[g][p] = QA_V_FMA(QA_V_LOAD(q[g] + d), k, acc[g][p]);
        }
    }
    const __m128 vs = _mm_set1_ps(scale);
#pragma GCC unroll 4
    for (int g = 0; g < GB; g++)
        _mm_storeu_ps(&s[g][s0], _mm_mul_ps(qattn_reduce4(QA_V_HALVES(acc[g][0]), QA_V_HALVES(acc[g][1]),
                                                         QA_V_HALVES(acc[g][2]), QA_V_HALVES(acc[g][3])),
                                           vs));
}

/* The scores of every head of the group (q, one row each) against the n decoded rows: four
 * positions at a time, then one at a time by QA_DOT; into s[g][s0 ..]. */
static void qa_scores(const float (*q)[QATTN_MAX_HEAD_DIM], int group, int hd,
                      const float (*rows)[QATTN_MAX_HEAD_DIM], int n, float scale,
                      float (*s)[QATTN_MAX_BLOCK], int s0)
{
    for (int g = 0; g < group; g += QA_QK_HEADS) {
        int j = 0;
        for (; j + 4 <= n; j += 4)
            switch (group - g < QA_QK_HEADS ? group - g : QA_QK_HEADS) {
            case 1: qa_scores4(q + g, hd, rows, j, scale, s + g, s0 + j, 1); break;
#if QA_QK_HEADS >= 2
            case 2: qa_scores4(q + g, hd, rows, j, scale, s + g, s0 + j, 2); break;
#endif
#if QA_QK_HEADS >= 4
            case 3: qa_scores4(q + g, hd, rows, j, scale, s + g, s0 + j, 3); break;
            case 4: qa_scores4(q + g, hd, rows, j, scale, s + g, s0 + j, 4); break;
#endif
            }
        for (; j < n; j++)
            for (int h = g; h < group && h < g + QA_QK_HEADS; h++)
                s[h][s0 + j] = QA_DOT(q[h], rows[j], hd) * scale;
    }
}

/* acc_g += p_g[j] v_j over the n decoded rows for the GB heads from acc and DV sixteen-float
 * slices from d0, the sums in registers across the rows; with first, acc_g is first scaled by
 * first[g] (the block's softmax correction). Each element as vec_scale_axpy gives it, a row at
 * a time: y * corr, then one fused multiply-add per position in position order. */
QA_AI void qa_pv_slices(float (*acc)[QATTN_MAX_HEAD_DIM], const float (*p)[QATTN_MAX_BLOCK],
                        int s0, const float (*rows)[QATTN_MAX_HEAD_DIM], int n,
                        const float *first, int d0, const int GB, const int DV)
{
    QA_V y[4][2];
#pragma GCC unroll 4
    for (int g = 0; g < GB; g++)
#pragma GCC unroll 2
        for (int v = 0; v < DV; v++) {
            y[g][v] = QA_V_LOAD(acc[g] + d0 + 16 * v);
            if (first)
                y[g][v] = QA_V_MUL(QA_V_SET1(first[g]), y[g][v]);
        }
    for (int j = 0; j < n; j++) {
        QA_V pb[4];
#pragma GCC unroll 4
        for (int g = 0; g < GB; g++)
            pb[g] = QA_V_SET1(p[g][s0 + j]);
#pragma GCC unroll 2
        for (int v = 0; v < DV; v++) {
            QA_V x = QA_V_LOAD(rows[j] + d0 + 16 * v);
#pragma GCC unroll 4
            for (int g = 0; g < GB; g++)
                y[g][v] = QA_V_FMA(pb[g], x, y[g][v]);
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < GB; g++)
#pragma GCC unroll 2
        for (int v = 0; v < DV; v++)
            QA_V_STORE(acc[g] + d0 + 16 * v, y[g][v]);
}

/* Every slice of head_dim for the GB heads from acc, QA_PV_SLICES slices a pass. */
QA_AI void qa_pv_heads(float (*acc)[QATTN_MAX_HEAD_DIM], const float (*p)[QATTN_MAX_BLOCK],
                       int s0, const float (*rows)[QATTN_MAX_HEAD_DIM], int n, int hd,
                       const float *first, const int GB)
{
    int d = 0;
    for (; d + 16 * QA_PV_SLICES <= hd; d += 16 * QA_PV_SLICES)
        qa_pv_slices(acc, p, s0, rows, n, first, d, GB, QA_PV_SLICES);
    for (; d < hd; d += 16)
        qa_pv_slices(acc, p, s0, rows, n, first, d, GB, 1);
}

/* The group's P V over the n decoded rows, four heads at a time. */
static void qa_pv(float (*acc)[QATTN_MAX_HEAD_DIM], int group, const float (*p)[QATTN_MAX_BLOCK],
                  int s0, const float (*rows)[QATTN_MAX_HEAD_DIM], int n, int hd,
                  const float *first)
{
    for (int g = 0; g < group; g += 4)
        switch (group - g < 4 ? group - g : 4) {
        case 1: qa_pv_heads(acc + g, p + g, s0, rows, n, hd, first ? first + g : NULL, 1); break;
        case 2: qa_pv_heads(acc + g, p + g, s0, rows, n, hd, first ? first + g : NULL, 2); break;
        case 3: qa_pv_heads(acc + g, p + g, s0, rows, n, hd, first ? first + g : NULL, 3); break;
        case 4: qa_pv_heads(acc + g, p + g, s0, rows, n, hd, first ? first + g : NULL, 4); break;
        }
}

/* One query row of every head sharing kv_head, over positions [first_pos,
 * last_pos], a block at a time with a running softmax: each K and V record is
 * decoded once into a row of floats and used by the whole group, QA_TILE rows at a
 * time (scores and P V then keep their sums in registers across the rows; a QJL key's
 * second dot product goes a record at a time). The next block's records are asked for
 * while this one's are used. */
static void QA_GROUP(const struct qattn_job *job, const struct attn_span *sp, int row,
                     int kv_head)
{
    const struct kv_cache *kv = job->kv;
    const struct kv_quant_layer *l = kvq_layer(kv->quant, job->layer);
    const struct kvq_codebooks *cb = &job->impl->codebooks;
    uint64_t seed = kv->quant->seed;
    int hd = kv->head_dim;
    int group = job->n_heads / kv->n_kv_heads;
    bool turbo = l->scheme == KV_QUANT_TURBO, qjl = turbo && l->qjl;
    const float *k_levels = cb->levels[kvq_code_bits(l, false)];
    const float *v_levels = cb->levels[kvq_code_bits(l, true)];
    int kb = kvq_head_bytes(l, hd, false), vb = kvq_head_bytes(l, hd, true);
    int last_pos = sp->pos0 + (row - sp->row0);
    int first_pos = 0;
    if (job->sliding_window > 0 && last_pos - job->sliding_window + 1 > 0)
        first_pos = last_pos - job->sliding_window + 1;

    float qr[QATTN_MAX_GROUP][QATTN_MAX_HEAD_DIM]; /* queries, rotated for TURBO keys */
    float qs[QATTN_MAX_GROUP][QATTN_MAX_HEAD_DIM]; /* and once more for the QJL signs */
    float acc[QATTN_MAX_GROUP][QATTN_MAX_HEAD_DIM];
    float scores[QATTN_MAX_GROUP][QATTN_MAX_BLOCK];
    float running_max[QATTN_MAX_GROUP], running_sum[QATTN_MAX_GROUP], corr[QATTN_MAX_GROUP];
    float rows[QA_TILE][QATTN_MAX_HEAD_DIM] __attribute__((aligned(64))), z[QATTN_MAX_HEAD_DIM];
    float qjl_coef_unit = 1.2533141373155003f / sqrtf((float)hd); /* sqrt(pi/2) / sqrt(hd) */
    for (int g = 0; g < group; g++) {
        int head = kv_head * group + g;
        memcpy(qr[g], job->q + ((size_t)row * job->n_heads + head) * hd, (size_t)hd * sizeof(float));
        if (turbo)
            cpu_kvq_rotate(qr[g], hd, seed, 0, job->layer, false);
        if (qjl) {
            memcpy(qs[g], qr[g], (size_t)hd * sizeof(float));
            cpu_kvq_rotate(qs[g], hd, seed, 2, job->layer, false);
        }
        memset(acc[g], 0, (size_t)hd * sizeof(float));
        running_max[g] = -FLT_MAX;
        running_sum[g] = 0.0f;
    }
    size_t head_k = (size_t)kv_head * kb, head_v = (size_t)kv_head * vb;
    size_t kstride = kv_cache_row_bytes(kv, false), vstride = kv_cache_row_bytes(kv, true);

    for (int start = first_pos; start <= last_pos;) {
        uint32_t block = sp->block_ids[start / kv->block_size];
        int slot0 = start % kv->block_size;
        int n = kv->block_size - slot0;
        if (start + n > last_pos + 1)
            n = last_pos + 1 - start;
        start += n;
        const uint8_t *kbase = (const uint8_t *)kv->k + row_offset(kv, job->layer, block, slot0, false);
        const uint8_t *vbase = (const uint8_t *)kv->v + row_offset(kv, job->layer, block, slot0, true);
        /* the next block's records, asked for a position at a time as this block's are used
         * (K's while scoring, V's while adding) */
        int n_next = 0;
        const uint8_t *knext = NULL, *vnext = NULL;
        if (start <= last_pos) {
            n_next = last_pos + 1 - start < kv->block_size ? last_pos + 1 - start : kv->block_size;
            uint32_t next = sp->block_ids[start / kv->block_size];
            knext = (const uint8_t *)kv->k + row_offset(kv, job->layer, next, 0, false) + head_k;
            vnext = (const uint8_t *)kv->v + row_offset(kv, job->layer, next, 0, true) + head_v;
            for (int j = n; j < n_next; j++) { /* past a short first block's positions */
                qattn_prefetch_record(knext + j * kstride, kb);
                qattn_prefetch_record(vnext + j * vstride, vb);
            }
        }
        if (qjl) {
            for (int j = 0; j < n; j++) {
                if (j < n_next)
                    qattn_prefetch_record(knext + j * kstride, kb);
                const uint8_t *rec = kbase + j * kstride + head_k;
                QA_DECODE_RECORD(l, k_levels, hd, false, rec, rows[0]);
                QA_DECODE_SIGNS(l, hd, rec, z);
                float coef = qattn_load_f16(rec + 2) * qjl_coef_unit;
                for (int g = 0; g < group; g++)
                    scores[g][j] =
                        (QA_DOT(qr[g], rows[0], hd) + coef * QA_DOT(qs[g], z, hd)) * job->scale;
            }
        } else {
            for (int t0 = 0; t0 < n; t0 += QA_TILE) {
                int tn = n - t0 < QA_TILE ? n - t0 : QA_TILE;
                for (int j = t0; j < t0 + tn; j++) {
                    if (j < n_next)
                        qattn_prefetch_record(knext + j * kstride, kb);
                    QA_DECODE_RECORD(l, k_levels, hd, false, kbase + j * kstride + head_k,
                                     rows[j - t0]);
                }
                qa_scores((const float(*)[QATTN_MAX_HEAD_DIM])qr, group, hd,
                          (const float(*)[QATTN_MAX_HEAD_DIM])rows, tn, job->scale, scores, t0);
            }
        }
        for (int g = 0; g < group; g++) {
            float block_max = QA_ROW_MAX(scores[g], n);
            float new_max = block_max > running_max[g] ? block_max : running_max[g];
            corr[g] = expf(running_max[g] - new_max);
            running_sum[g] = fmaf(running_sum[g], corr[g], QA_ROW_EXP(scores[g], n, new_max));
            running_max[g] = new_max;
        }
        for (int t0 = 0; t0 < n; t0 += QA_TILE) {
            int tn = n - t0 < QA_TILE ? n - t0 : QA_TILE;
            for (int j = t0; j < t0 + tn; j++) {
                if (j < n_next)
                    qattn_prefetch_record(vnext + j * vstride, vb);
                QA_DECODE_RECORD(l, v_levels, hd, true, vbase + j * vstride + head_v, rows[j - t0]);
            }
            qa_pv(acc, group, (const float(*)[QATTN_MAX_BLOCK])scores, t0,
                  (const float(*)[QATTN_MAX_HEAD_DIM])rows, tn, hd, t0 == 0 ? corr : NULL);
        }
    }
    for (int g = 0; g < group; g++) {
        int head = kv_head * group + g;
        float *out = job->out + ((size_t)row * job->n_heads + head) * hd;
        float inv = 1.0f / running_sum[g];
        for (int d = 0; d < hd; d++)
            out[d] = acc[g][d] * inv;
        if (turbo) /* values were accumulated in their rotated frame */
            cpu_kvq_rotate(out, hd, seed, 1, job->layer, true);
    }
}

/* Work items are (row, kv head) pairs dealt round-robin, which balances the
 * causal triangle: later rows attend over more positions. */
/* Items dealt round-robin: (row, kv head) pairs, or whole rows (every kv head in turn) while
 * that leaves two a thread: a slot holds the kv heads' records side by side, and one core then
 * reads each slot's cache lines whole instead of two cores sharing them. */
void QA_ROWS(void *ctx, int ith, int nth)
{
    struct qattn_job *job = ctx;
    long rows = 0, item = 0;
    for (int s = 0; s < job->n_spans; s++)
        rows += job->spans[s].n_tokens;
    int n_kv = job->kv->n_kv_heads;
    bool together = n_kv > 1 && rows >= 2L * nth;
    for (int s = 0; s < job->n_spans; s++) {
        const struct attn_span *sp = &job->spans[s];
        for (int r = 0; r < sp->n_tokens; r++)
            for (int h = 0; h < n_kv; h++) {
                if (item % nth == ith)
                    QA_GROUP(job, sp, sp->row0 + r, h);
                item += !together || h == n_kv - 1;
            }
    }
}

