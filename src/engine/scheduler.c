/* engine/scheduler.c — the scheduling policy: which waiting sequences are admitted, what each
 * step computes (a token for every decoding sequence, prefill chunks in the remaining budget,
 * the last token of each finishing one), and who gives KV blocks back when they run out (the
 * latest admitted, to be recomputed). */
#include <stdlib.h>
#include <string.h>

#include "engine/scheduler.h"

#include "base/timer.h"

int sched_init(struct sched *sc, const struct model *m, const struct sched_config *cfg,
               struct engine_metrics *metrics, struct err *err)
{
    memset(sc, 0, sizeof *sc);
    sc->model = m;
    sc->cfg = *cfg;
    sc->metrics = metrics;
    int block_size = cfg->block_size ? cfg->block_size : KV_BLOCK_SIZE_DEFAULT;
    sc->cfg.block_size = block_size;
    int min_blocks = kv_blocks_for(cfg->n_ctx, block_size);
    if (sc->cfg.kv_blocks == 0) {
        /* room for max_seqs full contexts, and beside them for what the
         * prefix cache may keep unreferenced */
        struct kv_format f = kv_format_of_backend(m->backend);
        size_t cache_blocks =
            cfg->prefix.max_bytes / kv_format_bytes_per_block(&m->config, &f, block_size);
        long blocks = (long)min_blocks * cfg->max_seqs + (long)cache_blocks;
        sc->cfg.kv_blocks = blocks > (1L << 30) ? 1 << 30 : (int)blocks;
    }
    if (sc->cfg.kv_blocks < min_blocks)
        sc->cfg.kv_blocks = min_blocks;
    size_t vocab = (size_t)m->config.vocab_size;
    size_t n = (size_t)cfg->max_seqs;
    size_t n_entries = 2 * n; /* running and finishing */
    /* Sliding-window layers keep only their windows: slots for every
     * sequence's window and chunk (running and finishing, and one more),
     * never more than the blocks. Not under the SSD tier, whose blocks carry
     * every layer. */
    int per_seq = cfg->tier ? 0 : kv_manager_slots_per_seq(&m->config, block_size,
                                                            cfg->max_step_tokens);
    long slots = (long)per_seq * (2L * cfg->max_seqs + 1);
    int rc = per_seq > 0
                 ? kv_manager_create_windowed(m, m->backend, sc->cfg.kv_blocks,
                                              slots < sc->cfg.kv_blocks ? (int)slots
                                                                        : sc->cfg.kv_blocks,
                                              block_size, &sc->kv, err)
                 : kv_manager_create(m, m->backend, sc->cfg.kv_blocks, block_size, &sc->kv, err);
    if (rc == 0)
        rc = kv_manager_prefix_enable(sc->kv, &cfg->prefix, err);
    if (rc == 0 && cfg->tier)
        rc = kv_manager_tier_enable(sc->kv, cfg->tier, err);
    if (rc == 0)
        rc = forward_state_create(m, cfg->max_step_tokens, &sc->fwd, err);
    size_t rows = n;
    if (rc == 0 && cfg->spec && cfg->spec->kind != SPEC_NONE) {
        rc = spec_drafter_create(cfg->spec, cfg->max_seqs, cfg->n_ctx, cfg->max_step_tokens,
                                 &sc->spec, err);
        sc->spec_max_batch = cfg->spec->max_batch;
        if (rc == 0 && !(sc->spec_seqs = calloc(n, sizeof *sc->spec_seqs)))
            rc = err_set(err, INFERD_ENOMEM, "out of memory for the engine's buffers");
        rows = n * (size_t)(1 + spec_drafter_max(sc->spec));
    }
    if (rc == 0) {
        sc->logits = malloc(rows * vocab * sizeof(float));
        sc->running = calloc(n, sizeof *sc->running);
        sc->finishing = calloc(n, sizeof *sc->finishing);
        sc->batch_seqs = calloc(n_entries, sizeof *sc->batch_seqs);
        sc->batch_owner = calloc(n_entries, sizeof *sc->batch_owner);
        sc->batch_chunk = calloc(n_entries, sizeof *sc->batch_chunk);
        sc->specs = calloc(rows, sizeof *sc->specs); /* a verify span's rows each get one */
        sc->results = calloc(rows, sizeof *sc->results);
        sc->unpublished = calloc(n, sizeof *sc->unpublished);
        if (!sc->logits || !sc->running || !sc->finishing || !sc->batch_seqs ||
            !sc->batch_owner || !sc->batch_chunk || !sc->specs || !sc->results ||
            !sc->unpublished)
            rc = err_set(err, INFERD_ENOMEM, "out of memory for the engine's buffers");
    }
    if (rc < 0)
        sched_free(sc);
    return rc;
}

void sched_free(struct sched *sc)
{
    free(sc->waiting);
    free(sc->running);
    free(sc->finishing);
    free(sc->batch_seqs);
    free(sc->batch_owner);
    free(sc->batch_chunk);
    free(sc->logits);
    free(sc->specs);
    free(sc->results);
    free(sc->unpublished);
    free(sc->spec_seqs);
    spec_drafter_free(sc->spec);
    forward_state_free(sc->fwd);
    kv_manager_destroy(sc->kv);
    memset(sc, 0, sizeof *sc);
}

bool sched_enqueue(struct sched *sc, struct seq *s, bool front)
{
    if (sc->n_waiting == sc->cap_waiting) {
        int cap = sc->cap_waiting ? sc->cap_waiting * 2 : 64;
        struct seq **grown = realloc(sc->waiting, (size_t)cap * sizeof *grown);
        if (!grown)
            return false;
        sc->waiting = grown;
        sc->cap_waiting = cap;
    }
    if (front) {
        memmove(sc->waiting + 1, sc->waiting, (size_t)sc->n_waiting * sizeof *sc->waiting);
        sc->waiting[0] = s;
    } else {
        sc->waiting[sc->n_waiting] = s;
    }
    sc->n_waiting++;
    return true;
}

/* s's positions whose K/V are written: all it counts as computed but, while
 * it continues a finishing sequence, the one that sequence's final step
 * computes. */
static int settled_positions(const struct seq *s)
{
    return s->continues ? s->n_computed - 1 : s->n_computed;
}

/* Ends a handoff (sched_admit) from either side. Unless the finishing
 * sequence's last token was computed (computed), the one that took it over
 * computes that position itself. */
static void handoff_end(struct sched *sc, struct seq *s, bool computed)
{
    struct seq *from = s->continues ? s->continues : s;
    struct seq *to = s->continues ? s : s->continued_by;
    if (!to)
        return;
    int last = from->n_tokens - 1;
    if (!computed && to != s && to->n_computed > last) {
        kv_manager_truncate(sc->kv, &to->kv, last);
        to->n_computed = to->kv.n_tokens;
    }
    from->continued_by = NULL;
    to->continues = NULL;
}

/* Hands s's computed full blocks to the prefix cache (a no-op with it off). */
static void publish_blocks(struct sched *sc, struct seq *s)
{
    if (s->out)
        kv_manager_publish(sc->kv, &s->kv, s->tokens, settled_positions(s));
}

/* Gives s's blocks back, what it computed left to the prefix cache (its
 * partial last block too), so that it re-enters, when admitted again,
 * through the cache. */
static void release_blocks(struct sched *sc, struct seq *s)
{
    if (s->out)
        kv_manager_retire(sc->kv, &s->kv, s->tokens, settled_positions(s));
    else
        kv_manager_free(sc->kv, &s->kv);
    handoff_end(sc, s, false);
    spec_seq_release(sc->spec, s);
    s->n_computed = 0;
    s->looked_up = false;
    s->loading = false;
}

void sched_publish(struct sched *sc, struct seq *s) { publish_blocks(sc, s); }

void sched_checkpoint(struct sched *sc, struct seq *s, bool force)
{
    if (!sc->ckpt || !s->ckpt)
        return;
    int n = s->n_tokens - s->n_prompt;
    if (n <= s->ckpt_saved || (!force && n - s->ckpt_saved < sc->ckpt_every))
        return;
    if ((size_t)n * sizeof(struct gen_token) != s->records.len)
        return;
    if (ckpt_store_save(sc->ckpt, s->ckpt_key, s->sampler->rng_state, s->n_prompt,
                        (const struct gen_token *)(const void *)s->records.data, n) == 0)
        s->ckpt_saved = n;
}

/* Counts s out and hands its finish to its reader. */
static void tell_reader(struct sched *sc, struct seq *s, enum gen_finish why, int error_code,
                        const char *error)
{
    /* A completed generation needs no checkpoint; a cancelled one keeps all
     * it got to, for an identical request to resume from. */
    if (sc->ckpt && s->ckpt && (why == GEN_FINISH_STOP || why == GEN_FINISH_LENGTH))
        ckpt_store_remove(sc->ckpt, s->ckpt_key);
    else if (why == GEN_FINISH_CANCELLED)
        sched_checkpoint(sc, s, true);
    /* Counted before the reader is told, so stats read after a finish include it. */
    if (why == GEN_FINISH_CANCELLED)
        atomic_fetch_add(&sc->counters.requests_cancelled, 1);
    else
        atomic_fetch_add(&sc->counters.requests_finished, 1);
    atomic_fetch_add(&sc->counters.generated_tokens, (uint64_t)(s->n_tokens - s->n_prompt));
    seq_finish(s, why, error_code, error);
    seq_publish(s);
}

void sched_publish_news(struct sched *sc)
{
    for (int i = 0; i < sc->n_unpublished; i++)
        seq_publish(sc->unpublished[i]);
    sc->n_unpublished = 0;
}

/* Frees a told s: a finished or cancelled sequence leaves what it computed
 * to the next request with the same prefix (keep); after an error the K/V
 * are not trusted. Its news went with the telling. */
static void let_go(struct sched *sc, struct seq *s, bool keep)
{
    for (int i = 0; i < sc->n_unpublished; i++)
        if (sc->unpublished[i] == s) {
            sc->unpublished[i] = sc->unpublished[--sc->n_unpublished];
            break;
        }
    if (keep)
        release_blocks(sc, s);
    handoff_end(sc, s, false);
    spec_seq_release(sc->spec, s);
    seq_free(s, sc->kv);
}

void sched_retire(struct sched *sc, struct seq *s, enum gen_finish why, int error_code,
                  const char *error)
{
    if (!s->out) {
        kv_manager_free(sc->kv, &s->kv);
        spec_seq_release(sc->spec, s);
        s->n_computed = 0;
        return;
    }
    tell_reader(sc, s, why, error_code, error);
    let_go(sc, s, why != GEN_FINISH_ERROR);
}

void sched_finish(struct sched *sc, struct seq *s, enum gen_finish why)
{
    /* Only the last sampled token lacks K/V; the next turn of a conversation
     * usually starts with all of it (the end-of-sequence token included). */
    if (!s->out || !kv_manager_prefix_enabled(sc->kv) || s->n_computed != s->n_tokens - 1 ||
        sc->n_finishing == sc->cfg.max_seqs) {
        sched_retire(sc, s, why, 0, NULL);
        return;
    }
    tell_reader(sc, s, why, 0, NULL);
    spec_seq_release(sc->spec, s); /* it drafts no more: its draft KV goes back now */
    s->finishing = true;
    sc->finishing[sc->n_finishing++] = s;
}

void sched_retire_finishing(struct sched *sc, struct seq *s, bool ok)
{
    handoff_end(sc, s, ok);
    let_go(sc, s, ok);
}

/* Lets the finishing sequences go with what they computed, last token or
 * not, but those taken over: freeing them would free nothing (their blocks
 * are shared) and their last token is owed. True when one went. */
static bool drop_finishing(struct sched *sc)
{
    int kept = 0, before = sc->n_finishing;
    for (int i = 0; i < sc->n_finishing; i++) {
        struct seq *s = sc->finishing[i];
        if (s->continued_by)
            sc->finishing[kept++] = s;
        else
            let_go(sc, s, true);
    }
    sc->n_finishing = kept;
    return kept < before;
}

/* When the waiting s's tokens continue a finishing sequence's whole
 * sequence (the next turn of its conversation, most often sent the moment
 * its reader was told), s takes that sequence's blocks over, the last token
 * included, which the finishing step computes in the step s first runs in or
 * earlier: no lookup misses the still unpublished tail, and nothing waits for
 * it to be published. False when none qualifies. */
static bool continue_finishing(struct sched *sc, struct seq *s)
{
    for (int i = 0; i < sc->n_finishing; i++) {
        struct seq *f = sc->finishing[i];
        struct err err = {0};
        if (f->continued_by || f->kv.ns != s->kv.ns || f->n_tokens >= s->n_tokens ||
            memcmp(f->tokens, s->tokens, (size_t)f->n_tokens * sizeof *s->tokens) != 0)
            continue;
        /* the last token's slot, now, so that s's table holds it */
        if (f->kv.n_tokens < f->n_tokens &&
            kv_manager_allocate_slots(sc->kv, &f->kv, f->n_tokens - f->kv.n_tokens, &err) < 0)
            return false;
        if (kv_manager_continue(sc->kv, &s->kv, &f->kv, &err) < 0)
            return false;
        s->n_computed = f->n_tokens;
        s->continues = f;
        f->continued_by = s;
        return true;
    }
    return false;
}

bool sched_idle(const struct sched *sc)
{
    return sc->n_waiting == 0 && sc->n_running == 0 && sc->n_finishing == 0;
}

static void running_remove_at(struct sched *sc, int i)
{
    memmove(sc->running + i, sc->running + i + 1,
            (size_t)(sc->n_running - i - 1) * sizeof *sc->running);
    sc->n_running--;
}

void sched_remove(struct sched *sc, struct seq *s)
{
    for (int i = 0; i < sc->n_running; i++)
        if (sc->running[i] == s) {
            running_remove_at(sc, i);
            return;
        }
    for (int i = 0; i < sc->n_waiting; i++)
        if (sc->waiting[i] == s) {
            memmove(sc->waiting + i, sc->waiting + i + 1,
                    (size_t)(sc->n_waiting - i - 1) * sizeof *sc->waiting);
            sc->n_waiting--;
            return;
        }
}

/* Gives the youngest running sequence's blocks back; it will be recomputed. */
static void preempt_youngest(struct sched *sc)
{
    struct seq *s = sc->running[sc->n_running - 1];
    sc->n_running--;
    atomic_fetch_add(&sc->counters.preemptions, 1);
    release_blocks(sc, s);
    if (!sched_enqueue(sc, s, true))
        sched_retire(sc, s, GEN_FINISH_ERROR, INFERD_ENOMEM,
                     "out of memory while requeueing a preempted request");
}

void sched_drop_cancelled(struct sched *sc, bool cancel_all)
{
    for (int i = 0; i < sc->n_running;) {
        struct seq *s = sc->running[i];
        if (cancel_all || (s->out && atomic_load(&s->out->cancel))) {
            running_remove_at(sc, i);
            sched_retire(sc, s, GEN_FINISH_CANCELLED, 0, NULL);
        } else {
            i++;
        }
    }
    for (int i = 0; i < sc->n_waiting;) {
        struct seq *s = sc->waiting[i];
        if (cancel_all || (s->out && atomic_load(&s->out->cancel))) {
            memmove(sc->waiting + i, sc->waiting + i + 1,
                    (size_t)(sc->n_waiting - i - 1) * sizeof *sc->waiting);
            sc->n_waiting--;
            if (s->admit_order == 0)
                atomic_fetch_sub(&sc->counters.n_queued, 1);
            sched_retire(sc, s, GEN_FINISH_CANCELLED, 0, NULL);
        } else {
            i++;
        }
    }
}

uint64_t sched_kv_bytes(const struct sched *sc, int n_positions, int n_shared)
{
    const struct kv_pool *pool = kv_manager_pool(sc->kv);
    uint64_t per_token = kv_format_bytes_per_token(&sc->model->config, &pool->format);
    return (uint64_t)(n_positions - n_shared) * per_token;
}

/* The KV budget's rule: s joins only when the projected KV of every running
 * sequence and its own (whole prompt + max_tokens, whatever is computed yet)
 * fits. Projections, not blocks held, so admitted sequences never run the
 * budget out as they grow. */
static bool kv_budget_admits(const struct sched *sc, const struct seq *s)
{
    if (sc->cfg.kv_budget_bytes == 0)
        return true;
    uint64_t total = sched_kv_bytes(sc, s->n_prompt + s->max_tokens, s->kv.n_cached);
    for (int i = 0; i < sc->n_running; i++) {
        const struct seq *r = sc->running[i];
        total += sched_kv_bytes(sc, r->n_prompt + r->max_tokens, r->kv.n_cached);
    }
    return total <= sc->cfg.kv_budget_bytes;
}

/* The request's reused prompt tokens (usage.cached_tokens). */
static void tell_cached(struct seq *s)
{
    if (!s->out || s->cached_told)
        return;
    s->cached_told = true;
    pthread_mutex_lock(&s->out->mu);
    s->out->n_cached = s->n_computed;
    pthread_mutex_unlock(&s->out->mu);
}

/* s was admitted with blocks loading from disk: false while they are; once
 * in, what loaded counts (a block that failed its read, and those after it,
 * were dropped: s computes them). */
static bool loaded(struct sched *sc, struct seq *s)
{
    if (!s->loading)
        return true;
    if (kv_manager_loading(sc->kv, &s->kv))
        return false;
    s->loading = false;
    s->n_computed = s->kv.n_tokens;
    tell_cached(s);
    return true;
}

void sched_admit(struct sched *sc)
{
    while (sc->n_waiting > 0 && sc->n_running < sc->cfg.max_seqs) {
        struct seq *s = sc->waiting[0];
        /* What the prefix cache already holds is attached first (and kept
         * while s waits at the head, so it cannot be evicted meanwhile). */
        if (!s->looked_up && s->kv.table.n_blocks == 0) {
            if (!continue_finishing(sc, s))
                s->n_computed = kv_manager_computed_blocks(sc->kv, &s->kv, s->tokens, s->n_tokens);
            s->looked_up = true;
        }
        /* FIFO: the head waits for budget rather than being overtaken. */
        if (!kv_budget_admits(sc, s))
            break;
        /* The rest of the prompt (and the first generated token) must fit
         * now, in free blocks or cached ones allocation may evict, so a new
         * sequence does not immediately push out the running ones. */
        int need = kv_manager_blocks_for(sc->kv, s->n_tokens + 1) - s->kv.table.n_blocks;
        if (kv_manager_available_blocks(sc->kv) < need)
            break;
        memmove(sc->waiting, sc->waiting + 1, (size_t)(sc->n_waiting - 1) * sizeof *sc->waiting);
        sc->n_waiting--;
        if (s->admit_order == 0) {
            s->t_admit_ns = now_ns();
            if (sc->metrics)
                histogram_observe(&sc->metrics->queue_time,
                                  (double)(s->t_admit_ns - s->t_submit_ns) * 1e-9);
            if (s->out) {
                pthread_mutex_lock(&s->out->mu);
                s->out->t_admit_ns = s->t_admit_ns;
                pthread_mutex_unlock(&s->out->mu);
                spec_seq_init(sc->spec, s, !s->no_speculation);
            }
            atomic_fetch_sub(&sc->counters.n_queued, 1);
            atomic_fetch_add(&sc->counters.requests_admitted, 1);
            atomic_fetch_add(&sc->counters.prompt_tokens, (uint64_t)s->n_prompt);
        }
        s->loading = kv_manager_loading(sc->kv, &s->kv);
        if (!s->loading)
            tell_cached(s);
        s->admit_order = ++sc->admissions;
        s->n_computed = s->kv.n_tokens;
        sc->running[sc->n_running++] = s;
    }
}

int sched_build_batch(struct sched *sc)
{
    /* One token of the step's budget is set aside for each finishing
     * sequence, so they never wait a second step. */
    int reserve = sc->n_finishing < sc->cfg.max_step_tokens ? sc->n_finishing
                                                            : sc->cfg.max_step_tokens;
    int budget = sc->cfg.max_step_tokens - reserve;
    int n = 0;
    struct err err = {0};
    /* Oldest first, so that when blocks run short the youngest (not yet in
     * the batch) are the ones pushed back. */
    for (int i = 0; i < sc->n_running && budget > 0; i++) {
        struct seq *s = sc->running[i];
        if (!loaded(sc, s))
            continue;
        int todo = s->n_tokens - s->n_computed;
        int chunk = todo < budget ? todo : budget;
        /* A decoding sequence with drafts verifies them: its pending token and the drafts in
         * one entry (as many as the budget leaves), every row's logits. */
        int n_drafts = todo == 1 && s->spec.n_drafts > 0 ? s->spec.n_drafts : 0;
        if (n_drafts > budget - 1)
            n_drafts = budget - 1;
        s->spec.n_drafts = n_drafts;
        if (n_drafts > 0) {
            s->spec.verify[0] = s->tokens[s->n_computed];
            chunk = 1 + n_drafts;
        }
        /* A one-token row may have its K/V write folded into the attention
         * that reads them (a backend's decode fusion), so it would not see
         * the finishing sequence's write of the position it took over in the
         * same step: it runs a step later. */
        if (s->continues && chunk < 2)
            continue;
        /* s->kv holds slots for exactly its n_computed positions here. */
        while (kv_manager_allocate_slots(sc->kv, &s->kv, chunk, &err) < 0) {
            if (drop_finishing(sc)) /* their blocks go to the cache, evictable, first */
                continue;
            bool last = sc->n_running - 1 == i; /* nothing younger to push back: this one waits */
            preempt_youngest(sc);
            if (last) {
                chunk = 0;
                break;
            }
        }
        if (chunk == 0)
            break;
        sc->batch_owner[n] = s;
        sc->batch_chunk[n] = chunk;
        sc->batch_seqs[n] = (struct batch_seq){
            .tokens = n_drafts > 0 ? s->spec.verify : s->tokens + s->n_computed,
            .n_tokens = chunk,
            .pos0 = s->n_computed,
            .block_ids = s->kv.table.blocks,
            .n_block_ids = s->kv.table.n_blocks,
            .all_logits = n_drafts > 0,
            .no_logits = s->embed || (n_drafts == 0 && s->n_computed + chunk < s->n_tokens),
            /* an embedding's last prompt row: its hidden state, not logits */
            .hidden_out = s->embed && s->n_computed + chunk == s->n_tokens && s->out
                              ? s->out->embedding
                              : NULL,
            .adapters = (const struct lora_adapter *const *)s->adapters,
            .n_adapters = s->n_adapters,
        };
        n++;
        budget -= chunk;
    }
    budget += reserve;
    /* The finishing take their last token's slot from what the running left
     * (evicting cached blocks at most, never preempting; one taken over has
     * it already); without one they go with what they computed. */
    for (int i = 0; i < sc->n_finishing; i++) {
        struct seq *s = sc->finishing[i];
        bool slotted = s->kv.n_tokens == s->n_tokens;
        if (budget == 0 || (!slotted && kv_manager_allocate_slots(sc->kv, &s->kv, 1, &err) < 0)) {
            let_go(sc, s, true);
            continue;
        }
        sc->batch_owner[n] = s;
        sc->batch_chunk[n] = 1;
        sc->batch_seqs[n] = (struct batch_seq){
            .tokens = s->tokens + s->n_computed,
            .n_tokens = 1,
            .pos0 = s->n_computed,
            .block_ids = s->kv.table.blocks,
            .n_block_ids = s->kv.table.n_blocks,
            .no_logits = true,
            .adapters = (const struct lora_adapter *const *)s->adapters,
            .n_adapters = s->n_adapters,
        };
        n++;
        budget--;
    }
    sc->n_finishing = 0;
    return n;
}
