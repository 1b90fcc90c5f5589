/* backend/cpu/attn_quant_group.h — the body of quantized attention's row kernel, included once per ISA file after it defines QA_DECODE_RECORD, QA_DECODE_SIGNS, QA_DOT, QA_AXPY (its vector helpers), QA_GROUP and QA_ROWS (the names to give). No include guard: each inclusion is one variant. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/attn_quant_kernels.h"
#include "backend/kv_quant.h"

/* One query row of every head sharing kv_head, over positions [first_pos,
 * last_pos], a block at a time with a running softmax: each K and V record is
 * decoded once into a row of floats and used by the whole group. The next
 * block's records are asked for while this one's are used. */
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
    float krow[QATTN_MAX_HEAD_DIM], vrow[QATTN_MAX_HEAD_DIM], z[QATTN_MAX_HEAD_DIM];
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
        for (int j = 0; j < n; j++) {
            if (j < n_next)
                qattn_prefetch_record(knext + j * kstride, kb);
            const uint8_t *rec = kbase + j * kstride + head_k;
            QA_DECODE_RECORD(l, k_levels, hd, false, rec, krow);
            float coef = 0;
            if (qjl) {
                QA_DECODE_SIGNS(l, hd, rec, z);
                coef = qattn_load_f16(rec + 2) * qjl_coef_unit;
            }
            for (int g = 0; g < group; g++) {
                float s = QA_DOT(qr[g], krow, hd);
                if (qjl)
                    s += coef * QA_DOT(qs[g], z, hd);
                scores[g][j] = s * job->scale;
            }
        }
        for (int g = 0; g < group; g++) {
            float block_max = -FLT_MAX;
            for (int j = 0; j < n; j++)
                block_max = scores[g][j] > block_max ? scores[g][j] : block_max;
            float new_max = block_max > running_max[g] ? block_max : running_max[g];
            corr[g] = expf(running_max[g] - new_max);
            running_sum[g] *= corr[g];
            for (int j = 0; j < n; j++) {
                scores[g][j] = expf(scores[g][j] - new_max);
                running_sum[g] += scores[g][j];
            }
            running_max[g] = new_max;
        }
        for (int j = 0; j < n; j++) {
            if (j < n_next)
                qattn_prefetch_record(vnext + j * vstride, vb);
            QA_DECODE_RECORD(l, v_levels, hd, true, vbase + j * vstride + head_v, vrow);
            for (int g = 0; g < group; g++)
                QA_AXPY(acc[g], j == 0 ? corr[g] : 1.0f, scores[g][j], vrow, hd);
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

