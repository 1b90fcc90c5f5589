/* model/forward.c — one forward step of a decoder over a varlen batch, through backend ops: the driver every family shares.
 *
 * Reads top to bottom like the architecture: lay the batch out as rows,
 * embed, then each layer through the model's family (model/arch.h; the
 * Llama family's norm -> attention -> residual, norm -> MLP -> residual is
 * model/arch/llama.c), then the final norm and the LM head for the rows whose
 * logits were asked for, copied out or sampled where they are. */
#include <stdlib.h>
#include <string.h>

#include "backend/collective.h"
#include "model/arch.h"
#include "model/lora.h"
#include "model/tensor_parallel.h"

/* The LM head runs over this many rows at a time, bounding the logits buffer
 * (32 MB at a 128k vocabulary). A decode step of that many sequences reads
 * the head's weights once: at 16 rows a 64-sequence step of Llama-3.1-8B
 * read its 1 GB four times, each chunk a launch and a wait of its own. */
#define LOGITS_CHUNK_ROWS 64

int batch_n_outputs(const struct batch *batch)
{
    int n = 0;
    for (int s = 0; s < batch->n_seqs; s++)
        n += batch->seqs[s].no_logits || batch->seqs[s].hidden_out ? 0
             : batch->seqs[s].all_logits                        ? batch->seqs[s].n_tokens
                                                                : 1;
    return n;
}

void forward_state_free(struct forward_state *st)
{
    if (!st)
        return;
    float *bufs[] = {st->x,       st->xn,     st->q,           st->attn,
                     st->k,       st->v,      st->gate,        st->up,
                     st->proj,    st->head_in, st->logits,     st->router,
                     (float *)st->moe_ids, st->moe_weights, st->moe_scratch, st->shared_out,
                     st->shared_gate};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            st->be->ops->release(st->be, bufs[i]);
    free(st->tokens);
    free(st->positions);
    free(st->out_rows);
    free(st->spans);
    free(st->lora_runs);
    free(st->lora_segs);
    if (st->lora_scratch)
        st->be->ops->release(st->be, st->lora_scratch);
    free(st->window_spans);
    free(st->window_ids);
    for (int r = 0; st->ranks && r < st->n_ranks; r++)
        forward_state_free(st->ranks[r]);
    free(st->ranks);
    free(st);
}

/* Rows of the gate and up buffers: the dense MLP's or a shared expert's, the wider. */
static uint64_t mlp_width(const struct model_config *c)
{
    return (uint64_t)(c->shared_expert_intermediate_size > c->intermediate_size
                          ? c->shared_expert_intermediate_size
                          : c->intermediate_size);
}

/* Floats per row of the mixture-of-experts buffers (0 for a dense model). */
static uint64_t moe_row_floats(const struct model_config *c)
{
    if (c->n_experts == 0)
        return 0;
    uint64_t k = (uint64_t)c->n_experts_per_tok;
    return (uint64_t)c->n_experts + 2 * k + moe_scratch_floats(1, (int)k, c->moe_intermediate_size,
                                                               c->hidden_size) +
           (c->shared_expert_intermediate_size ? (uint64_t)c->hidden_size + 1 : 0);
}

uint64_t forward_state_bytes(const struct model_config *c, int max_tokens)
{
    /* The buffers of forward_state_create, in its order. */
    uint64_t rows = (uint64_t)max_tokens, f = sizeof(float);
    uint64_t q_dim = (uint64_t)c->n_heads * c->head_dim, kv_dim = (uint64_t)c->n_kv_heads * c->head_dim;
    uint64_t per_row = 2 * (uint64_t)c->hidden_size + 2 * q_dim + 2 * kv_dim +
                       2 * mlp_width(c) + 2 * (uint64_t)c->hidden_size + moe_row_floats(c);
    return rows * per_row * f + (uint64_t)LOGITS_CHUNK_ROWS * c->vocab_size * f;
}

/* The mixture-of-experts buffers of st->max_tokens rows; -1 when out of memory. */
static int moe_state_alloc(struct forward_state *st, const struct model_config *c)
{
    struct backend *be = st->be;
    size_t rows = (size_t)st->max_tokens, k = (size_t)c->n_experts_per_tok;
    st->router = be->ops->alloc(be, rows * (size_t)c->n_experts * sizeof(float));
    st->moe_ids = be->ops->alloc(be, rows * k * sizeof(int32_t));
    st->moe_weights = be->ops->alloc(be, rows * k * sizeof(float));
    st->moe_scratch = be->ops->alloc(
        be, moe_scratch_floats(st->max_tokens, (int)k, c->moe_intermediate_size, c->hidden_size) *
                sizeof(float));
    if (c->shared_expert_intermediate_size) {
        st->shared_out = be->ops->alloc(be, rows * (size_t)c->hidden_size * sizeof(float));
        st->shared_gate = be->ops->alloc(be, rows * sizeof(float));
        if (!st->shared_out || !st->shared_gate)
            return -1;
    }
    return st->router && st->moe_ids && st->moe_weights && st->moe_scratch ? 0 : -1;
}

int forward_state_create(const struct model *m, int max_tokens, struct forward_state **out,
                         struct err *err)
{
    if (max_tokens < 1 || max_tokens > (1 << 20))
        return err_set(err, INFERD_ERANGE, "max tokens per step %d outside [1, 1048576]",
                       max_tokens);
    const struct model_config *c = &m->config;
    struct backend *be = m->backend;
    struct forward_state *st = calloc(1, sizeof *st);
    if (!st)
        return err_set(err, INFERD_ENOMEM, "out of memory for forward state");
    st->be = be;
    st->max_tokens = max_tokens;
    if (m->tp) { /* a group's front: its ranks' states, no buffers of its own */
        int rc = tp_states_create(m, st, max_tokens, err);
        if (rc < 0) {
            forward_state_free(st);
            return rc;
        }
        *out = st;
        return 0;
    }
    size_t rows = (size_t)max_tokens;
    size_t q_dim = (size_t)c->n_heads * c->head_dim, kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    st->x = be->ops->alloc(be, rows * c->hidden_size * sizeof(float));
    st->xn = be->ops->alloc(be, rows * c->hidden_size * sizeof(float));
    st->q = be->ops->alloc(be, rows * q_dim * sizeof(float));
    st->attn = be->ops->alloc(be, rows * q_dim * sizeof(float));
    st->k = be->ops->alloc(be, rows * kv_dim * sizeof(float));
    st->v = be->ops->alloc(be, rows * kv_dim * sizeof(float));
    st->gate = be->ops->alloc(be, rows * mlp_width(c) * sizeof(float));
    st->up = be->ops->alloc(be, rows * mlp_width(c) * sizeof(float));
    st->proj = be->ops->alloc(be, rows * c->hidden_size * sizeof(float));
    st->head_in = be->ops->alloc(be, rows * c->hidden_size * sizeof(float));
    st->logits = be->ops->alloc(be, (size_t)LOGITS_CHUNK_ROWS * c->vocab_size * sizeof(float));
    st->tokens = malloc(rows * sizeof(int32_t));
    st->positions = malloc(rows * sizeof(int32_t));
    st->out_rows = malloc(rows * sizeof(int32_t));
    if (!st->x || !st->xn || !st->q || !st->attn || !st->k || !st->v || !st->gate || !st->up ||
        !st->proj || !st->head_in || !st->logits || !st->tokens || !st->positions ||
        !st->out_rows || (c->n_experts && moe_state_alloc(st, c) < 0)) {
        forward_state_free(st);
        return err_set(err, INFERD_ENOMEM, "out of memory for activations of %d tokens",
                       max_tokens);
    }
    *out = st;
    return 0;
}

/* Whether sequences a and b take the same adapters in the same order. */
static bool same_adapters(const struct batch_seq *a, const struct batch_seq *b)
{
    if (a->n_adapters != b->n_adapters)
        return false;
    for (int i = 0; i < a->n_adapters; i++)
        if (a->adapters[i] != b->adapters[i])
            return false;
    return true;
}

/* The step's adapter runs: consecutive sequences with the same stack make one
 * group of rows, and each adapter of the stack one run over it, so an op
 * meets as many segments as there are distinct neighbouring stacks. */
static int lora_runs_build(const struct model *m, struct forward_state *st,
                           const struct batch *batch, struct err *err)
{
    st->n_lora_runs = 0;
    int need = 0;
    for (int s = 0; s < batch->n_seqs; s++) {
        int n = batch->seqs[s].n_adapters;
        if (n < 0 || n > LORA_MAX_STACK)
            return err_set(err, INFERD_EINVAL, "sequence %d stacks %d adapters (at most %d)", s,
                           n, LORA_MAX_STACK);
        for (int i = 0; i < n; i++) {
            const struct lora_adapter *a = batch->seqs[s].adapters[i];
            if (!a || a->be != m->backend || a->n_layers != m->config.n_layers)
                return err_set(err, INFERD_EINVAL, "sequence %d: adapter %d is not this model's",
                               s, i);
        }
        need += n;
    }
    if (need == 0)
        return 0;
    if (!m->backend->ops->lora)
        return err_set(err, INFERD_EUNSUPPORTED, "the %s backend cannot run adapters",
                       m->backend->ops->name);
    if (need > st->lora_runs_cap) {
        struct lora_run *runs = realloc(st->lora_runs, (size_t)need * sizeof *runs);
        if (runs)
            st->lora_runs = runs;
        struct lora_seg *segs = realloc(st->lora_segs, (size_t)need * sizeof *segs);
        if (segs)
            st->lora_segs = segs;
        if (!runs || !segs)
            return err_set(err, INFERD_ENOMEM, "out of memory for adapter runs");
        st->lora_runs_cap = need;
    }
    if (!st->lora_scratch) {
        /* allocated before any op of the step is recorded: no earlier op reads it */
        size_t floats = (size_t)st->max_tokens * LORA_MAX_STACK * LORA_MAX_RANK;
        st->lora_scratch = st->be->ops->alloc(st->be, floats * sizeof(float));
        if (!st->lora_scratch)
            return err_set(err, INFERD_ENOMEM, "out of memory for adapter scratch");
    }
    for (int s = 0; s < batch->n_seqs;) {
        const struct batch_seq *seq = &batch->seqs[s];
        int e = s + 1;
        while (e < batch->n_seqs && same_adapters(seq, &batch->seqs[e]))
            e++;
        int row0 = st->spans[s].row0;
        int rows = st->spans[e - 1].row0 + st->spans[e - 1].n_tokens - row0;
        for (int i = 0; i < seq->n_adapters; i++)
            st->lora_runs[st->n_lora_runs++] =
                (struct lora_run){.row0 = row0, .n_rows = rows, .adapter = seq->adapters[i]};
        s = e;
    }
    return 0;
}

void forward_all_reduce(const struct model *m, struct forward_state *st, float *buf, int64_t n)
{
    if (!m->comm || st->collective_rc < 0)
        return;
    st->collective_rc = collective_all_reduce_sum(m->comm, m->backend, buf, n, &st->collective_err);
}

void forward_lora(const struct model *m, struct forward_state *st, int layer, int t,
                  const float *x, int64_t in, int64_t out, float *y)
{
    if (st->n_lora_runs == 0)
        return;
    int n = 0;
    for (int i = 0; i < st->n_lora_runs; i++) {
        const struct lora_run *r = &st->lora_runs[i];
        const struct lora_pair *p = &r->adapter->pairs[(size_t)layer * LORA_N_TARGETS + t];
        if (p->a)
            st->lora_segs[n++] = (struct lora_seg){.row0 = r->row0, .n_rows = r->n_rows, .p = *p};
    }
    if (n > 0)
        m->backend->ops->lora(m->backend, x, in, out, st->lora_segs, n, st->lora_scratch, y);
}

/* A windowed cache's window layers read the spans' blocks through their
 * slots: st->window_spans, each over its blocks mapped to slots. A block
 * whose slot is gone is never read (it lies wholly before the window of the
 * span's first query: transformers' mask keeps positions p - window < j <= p),
 * and one the window still needs without a slot is an error, never a read of
 * other K/V. Returns the row count batch_prepare laid out. */
static int window_spans(struct forward_state *st, const struct kv_cache *kv,
                        const struct batch *batch, struct err *err)
{
    size_t total = 0;
    for (int s = 0; s < batch->n_seqs; s++)
        total += (size_t)st->spans[s].n_block_ids;
    if (total > st->window_ids_cap) {
        uint32_t *grown = realloc(st->window_ids, total * sizeof *grown);
        if (!grown)
            return err_set(err, INFERD_ENOMEM, "out of memory for window block tables");
        st->window_ids = grown;
        st->window_ids_cap = total;
    }
    int bs = kv->block_size, rows = 0;
    size_t at = 0;
    for (int s = 0; s < batch->n_seqs; s++) {
        const struct attn_span *sp = &st->spans[s];
        int first = sp->pos0 - kv->window_positions + 1;
        long first_block = first > 0 ? first / bs : 0;
        long needed = ((long)sp->pos0 + sp->n_tokens + bs - 1) / bs;
        uint32_t *ids = st->window_ids + at;
        for (long b = 0; b < sp->n_block_ids; b++) {
            uint32_t slot = b < needed ? kv->window_slot[sp->block_ids[b]] : UINT32_MAX;
            if (slot == UINT32_MAX && b >= first_block && b < needed)
                return err_set(err, INFERD_EINVAL,
                               "sequence %d: block %ld is inside the sliding window but its "
                               "K/V were released", s, b);
            ids[b] = slot == UINT32_MAX ? 0 : slot;
        }
        st->window_spans[s] = *sp;
        st->window_spans[s].block_ids = ids;
        at += (size_t)sp->n_block_ids;
        rows = sp->row0 + sp->n_tokens;
    }
    return rows;
}

/* Checks the batch against the model and the KV cache, and lays its tokens
 * out as consecutive rows. */
static int batch_prepare(const struct model *m, struct forward_state *st,
                         const struct kv_cache *kv, const struct batch *batch, struct err *err)
{
    if (batch->n_seqs < 1)
        return err_set(err, INFERD_EINVAL, "empty batch");
    if (batch->n_seqs > st->spans_cap) {
        struct attn_span *grown = realloc(st->spans, (size_t)batch->n_seqs * sizeof *grown);
        if (grown)
            st->spans = grown;
        struct attn_span *wgrown =
            grown ? realloc(st->window_spans, (size_t)batch->n_seqs * sizeof *wgrown) : NULL;
        if (!wgrown)
            return err_set(err, INFERD_ENOMEM, "out of memory for batch spans");
        st->window_spans = wgrown;
        st->spans_cap = batch->n_seqs;
    }
    int row = 0;
    for (int s = 0; s < batch->n_seqs; s++) {
        const struct batch_seq *seq = &batch->seqs[s];
        if (seq->n_tokens < 1 || seq->pos0 < 0)
            return err_set(err, INFERD_EINVAL, "sequence %d has %d tokens at position %d", s,
                           seq->n_tokens, seq->pos0);
        if (seq->n_tokens > st->max_tokens - row)
            return err_set(err, INFERD_ERANGE, "batch has more than %d tokens", st->max_tokens);
        long needed_blocks = ((long)seq->pos0 + seq->n_tokens + kv->block_size - 1) / kv->block_size;
        if (seq->n_block_ids < needed_blocks)
            return err_set(err, INFERD_EINVAL,
                           "sequence %d: block table covers %d blocks, positions need %ld", s,
                           seq->n_block_ids, needed_blocks);
        for (long b = 0; b < needed_blocks; b++)
            if (seq->block_ids[b] >= (uint32_t)kv->n_blocks)
                return err_set(err, INFERD_EINVAL, "sequence %d: block id %u outside the pool", s,
                               seq->block_ids[b]);
        for (int i = 0; i < seq->n_tokens; i++) {
            int32_t tok = seq->tokens[i];
            if (tok < 0 || tok >= m->config.vocab_size)
                return err_set(err, INFERD_EINVAL, "token id %d outside the vocabulary [0, %d)",
                               tok, m->config.vocab_size);
            st->tokens[row + i] = tok;
            st->positions[row + i] = seq->pos0 + i;
        }
        st->spans[s] = (struct attn_span){
            .row0 = row,
            .n_tokens = seq->n_tokens,
            .pos0 = seq->pos0,
            .block_ids = seq->block_ids,
            .n_block_ids = seq->n_block_ids,
        };
        row += seq->n_tokens;
    }
    int rc = lora_runs_build(m, st, batch, err);
    if (rc < 0)
        return rc;
    return kv->window ? window_spans(st, kv, batch, err) : row;
}

/* The final RMSNorm of x's rows [x_row, x_row + n) into head_in's from out_row on. */
static void final_norm_rows(const struct model *m, struct forward_state *st, int x_row, int n,
                            int out_row)
{
    const struct model_config *c = &m->config;
    m->backend->ops->rmsnorm(m->backend, st->x + (size_t)x_row * c->hidden_size,
                             m->weights.final_norm, n, c->hidden_size, c->rms_norm_eps,
                             st->head_in + (size_t)out_row * c->hidden_size);
}

/* Final norm of the wanted rows only, then the LM head in chunks; each chunk
 * sampled on the device or copied to the host. The host's work for the picks
 * runs once the first chunk is started, while the device computes. */
static int lm_head(const struct model *m, struct forward_state *st, const struct batch *batch,
                   const struct forward_output *out, struct err *err)
{
    const struct model_config *c = &m->config;
    struct backend *be = m->backend;
    const struct backend_ops *op = be->ops;
    /* rows that follow each other in x (a decode step's, one a sequence) are normed in one
     * call: the pending run is x's rows [run_x, run_x + run_n), head_in's last run_n */
    int n_out = 0, run_x = 0, run_n = 0;
    for (int s = 0; s < batch->n_seqs; s++) {
        if (batch->seqs[s].no_logits || batch->seqs[s].hidden_out)
            continue;
        const struct attn_span *sp = &st->spans[s];
        int first = batch->seqs[s].all_logits ? sp->row0 : sp->row0 + sp->n_tokens - 1;
        int count = sp->row0 + sp->n_tokens - first;
        if (run_n > 0 && first != run_x + run_n) {
            final_norm_rows(m, st, run_x, run_n, n_out - run_n);
            run_n = 0;
        }
        if (run_n == 0)
            run_x = first;
        run_n += count;
        n_out += count;
    }
    if (run_n > 0)
        final_norm_rows(m, st, run_x, run_n, n_out - run_n);
    /* Embeddings: the final-normed last row of each such sequence, after the
     * logits rows in head_in, copied out as it is (no LM head). */
    int n_hidden = n_out;
    for (int s = 0; s < batch->n_seqs; s++) {
        if (!batch->seqs[s].hidden_out)
            continue;
        const struct attn_span *sp = &st->spans[s];
        float *row = st->head_in + (size_t)n_hidden * c->hidden_size;
        op->rmsnorm(be, st->x + (size_t)(sp->row0 + sp->n_tokens - 1) * c->hidden_size,
                    m->weights.final_norm, 1, c->hidden_size, c->rms_norm_eps, row);
        if (m->tp_rank == 0) /* every rank has the same row: rank 0 hands it out */
            op->to_host(be, batch->seqs[s].hidden_out, row, (size_t)c->hidden_size * sizeof(float));
        n_hidden++;
    }
    /* vocab_size, or under tensor parallelism this rank's columns of each
     * row from vocab_lo on, or the first head_rows the caller asked for; the
     * last two are written to the host rows a row at a time */
    struct weight_matrix head = m->weights.lm_head;
    if (out->head_rows > 0 && out->head_rows < head.rows && head.rows == c->vocab_size)
        head = model_matrix_rows(&head, 0, out->head_rows);
    int64_t width = head.rows;
    bool sampled = out->specs && op->sample && width == c->vocab_size;
    /* a backend whose memory is the host's writes whole rows where they are asked for */
    bool in_place = op->memory_is_host && !op->sample && width == c->vocab_size && out->host_rows;
    for (int r = 0; r < n_out; r += LOGITS_CHUNK_ROWS) {
        int rows = n_out - r < LOGITS_CHUNK_ROWS ? n_out - r : LOGITS_CHUNK_ROWS;
        float *logits = in_place ? out->host_rows + (size_t)r * c->vocab_size : st->logits;
        op->matmul(be, st->head_in + (size_t)r * c->hidden_size, rows, &head, NULL, logits);
        if (c->final_logit_softcap > 0)
            op->softcap(be, logits, (int64_t)rows * width, c->final_logit_softcap);
        if (r == 0 && out->before_rows) {
            if (op->submit)
                op->submit(be);
            int rc = out->before_rows(out->ctx, sampled, err);
            if (rc < 0)
                return rc;
            if (rc == 1)
                sampled = false;
        }
        size_t row0 = (size_t)r * c->vocab_size;
        if (in_place)
            continue;
        if (!sampled && width == c->vocab_size) {
            op->to_host(be, out->host_rows + row0, st->logits,
                        (size_t)rows * c->vocab_size * sizeof(float));
            continue;
        }
        if (!sampled) {
            int64_t lo = width == m->weights.lm_head.rows ? m->vocab_lo : 0;
            for (int i = 0; i < rows; i++)
                op->to_host(be, out->host_rows + row0 + (size_t)i * c->vocab_size + lo,
                            st->logits + (size_t)i * width, (size_t)width * sizeof(float));
            continue;
        }
        int rc = op->sample(be, st->logits, rows, c->vocab_size, out->specs + r, out->results + r,
                            out->host_rows + row0, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The step from the embedding through the LM head, the batch laid out as n_rows rows. */
static int forward_rank_layers(const struct model *m, struct forward_state *st,
                               struct kv_cache *kv, const struct batch *batch,
                               const struct forward_output *out, int n_rows, struct err *err)
{
    const struct model_config *c = &m->config;
    m->backend->ops->embed(m->backend, &m->weights.embed, st->tokens, n_rows, st->x);
    if (m->embed_scale > 0)
        m->backend->ops->scale(m->backend, st->x, (int64_t)n_rows * c->hidden_size,
                               m->embed_scale);
    st->collective_rc = 0;
    for (int l = 0; l < c->n_layers; l++)
        m->arch->layer(m, st, kv, l, n_rows, batch->n_seqs);
    if (st->collective_rc < 0) {
        *err = st->collective_err;
        return st->collective_rc;
    }
    int rc = lm_head(m, st, batch, out, err);
    if (rc < 0)
        return rc;
    if (m->backend->ops->status)
        return m->backend->ops->status(m->backend, err);
    return 0;
}

int model_forward_rank(const struct model *m, struct forward_state *st, struct kv_cache *kv,
                       const struct batch *batch, const struct forward_output *out,
                       struct err *err)
{
    const struct model_config *c = &m->config;
    int kv_layers = kv->n_layers + (kv->window ? kv->window->n_layers : 0);
    if (kv_layers != c->n_layers || kv->n_kv_heads != c->n_kv_heads ||
        kv->head_dim != c->head_dim)
        return err_set(err, INFERD_EINVAL, "KV cache geometry does not match the model");
    int n_rows = batch_prepare(m, st, kv, batch, err);
    if (n_rows < 0)
        return n_rows;
    /* the step's row ops may wait for the larger op after them (backend_ops.hold_row_ops) */
    const struct backend_ops *op = m->backend->ops;
    if (op->hold_row_ops)
        op->hold_row_ops(m->backend, n_rows);
    int rc = forward_rank_layers(m, st, kv, batch, out, n_rows, err);
    if (op->hold_row_ops)
        op->hold_row_ops(m->backend, 0);
    return rc;
}

int model_forward(const struct model *m, struct forward_state *st, struct kv_cache *kv,
                  const struct batch *batch, float *logits, struct err *err)
{
    struct forward_output out = {.host_rows = logits};
    return m->tp ? tp_forward(m, st, kv, batch, &out, err)
                 : model_forward_rank(m, st, kv, batch, &out, err);
}

bool model_samples_on_backend(const struct model *m)
{
    return m->backend->ops->sample != NULL && !m->tp;
}

bool model_overlaps_host_work(const struct model *m)
{
    return m->backend->ops->submit != NULL && !m->tp;
}

int model_forward_sampled(const struct model *m, struct forward_state *st, struct kv_cache *kv,
                          const struct batch *batch, const struct forward_output *out,
                          struct err *err)
{
    return m->tp ? tp_forward(m, st, kv, batch, out, err)
                 : model_forward_rank(m, st, kv, batch, out, err);
}
