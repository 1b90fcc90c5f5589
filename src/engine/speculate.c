/* engine/speculate.c — drafts for speculative decoding: the draft model (its own KV manager on
 * the target's backend, greedy proposals batched over the sequences), prompt lookup, the
 * grammar cut, and the adaptive number of drafts. */
#include "engine/speculate.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sequence.h"
#include "text/tokenizer.h"

struct spec_drafter {
    struct spec_config cfg;
    int max_drafts;
    int max_seqs, max_step_tokens;
    /* The draft model's serving state (SPEC_TWO_MODEL only): */
    struct kv_manager *kv;      /* owned */
    struct forward_state *fwd;  /* owned; max_step_tokens tokens */
    float *logits;              /* owned; max_seqs rows of the draft's vocabulary */
    struct batch_seq *entries;  /* owned; max_seqs */
    struct seq **owner;         /* owned; max_seqs */
    uint64_t steps;
    /* what drafting costs (spec_note_step, spec_note_drafting) */
    struct spec_costs verify; /* verify steps of one sequence, by rows */
    double draft_cost;        /* one draft forward, seconds (a moving average; 0: unmeasured) */
    /* The draft's head rows (cfg.draft_vocab 0: chosen here): every SPEC_SURVEY_EVERY-th
     * forward with logits reads the whole head and counts its picks by bucket of
     * SPEC_SURVEY_BUCKET ids (decayed); the others read the fewest rows that held
     * SPEC_SURVEY_SHARE of them. */
    bool auto_head;     /* cfg.draft_vocab 0 on a backend whose memory is the host's */
    _Atomic int head_rows; /* rows the forwards read now (read by /stats' thread too) */
    int pick_rows;      /* rows of this forward's picks */
    bool surveying;     /* this forward reads the whole head and counts */
    uint64_t forwards;  /* forwards with logits so far */
    float *survey;      /* owned; picks per bucket */
    int n_buckets;
};

/* ---- configuration --------------------------------------------------------- */

int spec_config_check(struct spec_config *c, const struct model *target, struct err *err)
{
    if (c->kind == SPEC_NONE)
        return 0;
    if (c->draft_vocab < 0)
        return err_set(err, INFERD_ERANGE, "--draft-vocab %d must be at least 1 (0: all)",
                       c->draft_vocab);
    if (c->draft_vocab > 0 && c->kind != SPEC_TWO_MODEL)
        return err_set(err, INFERD_EINVAL, "--draft-vocab limits a draft model's proposals; "
                       "--draft-kind ngram has none");
    if (c->kind == SPEC_NGRAM && c->draft)
        return err_set(err, INFERD_EINVAL,
                       "--draft-kind ngram drafts from the prompt and takes no --draft-model");
    if (c->kind == SPEC_TWO_MODEL && !c->draft)
        return err_set(err, INFERD_EINVAL, "--draft-kind two-model needs a --draft-model");
    if (c->kind == SPEC_CALLBACK && !c->draft_fn)
        return err_set(err, INFERD_EINVAL, "a callback drafter needs its function");
    if (c->num_draft_tokens == 0)
        c->num_draft_tokens = c->kind == SPEC_NGRAM ? SPEC_DRAFTS_NGRAM : SPEC_DRAFTS_TWO_MODEL;
    if (c->num_draft_tokens < 1 || c->num_draft_tokens > SPEC_MAX_DRAFTS)
        return err_set(err, INFERD_ERANGE, "--num-draft-tokens %d must be in [1, %d]",
                       c->num_draft_tokens, SPEC_MAX_DRAFTS);
    if (c->ngram_max == 0)
        c->ngram_max = SPEC_NGRAM_MAX;
    if (c->ngram_min == 0)
        c->ngram_min = c->ngram_max < SPEC_NGRAM_MIN ? c->ngram_max : SPEC_NGRAM_MIN;
    if (c->ngram_min < 1 || c->ngram_min > c->ngram_max || c->ngram_max > 64)
        return err_set(err, INFERD_ERANGE,
                       "--ngram-min %d and --ngram-max %d must satisfy 1 <= min <= max <= 64",
                       c->ngram_min, c->ngram_max);
    if (c->draft) {
        if (c->draft_vocab > c->draft->config.vocab_size)
            c->draft_vocab = c->draft->config.vocab_size;
        if (c->draft->config.vocab_size != target->config.vocab_size)
            return err_set(err, INFERD_EINVAL,
                           "the draft model's vocabulary has %d entries, the target's %d: a "
                           "draft must share the target's tokenizer",
                           c->draft->config.vocab_size, target->config.vocab_size);
        if (c->draft->backend != target->backend)
            return err_set(err, INFERD_EINVAL, "the draft model must be on the target's backend");
    }
    return 0;
}

static int same_text(const char *a, const char *b)
{
    return (!a && !b) || (a && b && !strcmp(a, b));
}

int spec_check_tokenizers(const struct tokenizer *target, const struct tokenizer *draft,
                          struct err *err)
{
    int n = tok_vocab_size(target), nd = tok_vocab_size(draft);
    if (n != nd)
        return err_set(err, INFERD_EINVAL,
                       "the draft model's tokenizer has %d tokens, the target's %d: a draft must "
                       "share the target's tokenizer", nd, n);
    for (int32_t id = 0; id < n; id++) {
        bool st = tok_is_special(target, id), sd = tok_is_special(draft, id);
        if (!st && !sd)
            continue;
        const char *pt = tok_id_to_piece(target, id), *pd = tok_id_to_piece(draft, id);
        if (st != sd || !same_text(pt, pd))
            return err_set(err, INFERD_EINVAL,
                           "the draft model's tokenizer differs in special token %d: '%s'%s in "
                           "the target, '%s'%s in the draft", (int)id, pt ? pt : "(none)",
                           st ? "" : " (not special)", pd ? pd : "(none)",
                           sd ? "" : " (not special)");
    }
    const char *(*names[])(const struct tokenizer *) = {tok_bos_token, tok_eos_token,
                                                        tok_pad_token};
    const char *what[] = {"bos", "eos", "pad"};
    for (int i = 0; i < 3; i++)
        if (!same_text(names[i](target), names[i](draft)))
            return err_set(err, INFERD_EINVAL,
                           "the draft model's %s token is '%s', the target's '%s'", what[i],
                           names[i](draft) ? names[i](draft) : "(none)",
                           names[i](target) ? names[i](target) : "(none)");
    return 0;
}

/* ---- the drafter ----------------------------------------------------------- */

int spec_drafter_create(const struct spec_config *c, int max_seqs, int n_ctx, int max_step_tokens,
                        struct spec_drafter **out, struct err *err)
{
    struct spec_drafter *d = calloc(1, sizeof *d);
    if (!d)
        return err_set(err, INFERD_ENOMEM, "out of memory for the drafter");
    d->cfg = *c;
    d->max_drafts = c->num_draft_tokens;
    d->max_seqs = max_seqs;
    d->max_step_tokens = max_step_tokens;
    int rc = 0;
    if (c->kind == SPEC_TWO_MODEL) {
        const struct model *m = c->draft;
        if (d->cfg.draft_vocab > m->config.vocab_size)
            d->cfg.draft_vocab = m->config.vocab_size;
        d->head_rows = d->cfg.draft_vocab > 0 ? d->cfg.draft_vocab : m->config.vocab_size;
        d->n_buckets = (m->config.vocab_size + SPEC_SURVEY_BUCKET - 1) / SPEC_SURVEY_BUCKET;
        /* On a device (a GPU) a draft step is launches replayed from captured graphs, one per
         * op list, and its head's rows take microseconds: every row there, one op list. */
        d->auto_head = d->cfg.draft_vocab == 0 && m->backend->ops->memory_is_host;
        /* every sequence's whole context plus its drafts, so drafting never preempts */
        int blocks = kv_blocks_for(n_ctx + SPEC_MAX_DRAFTS + 1, KV_BLOCK_SIZE_DEFAULT) * max_seqs;
        rc = kv_manager_create(m, m->backend, blocks, KV_BLOCK_SIZE_DEFAULT, &d->kv, err);
        if (rc == 0)
            rc = forward_state_create(m, max_step_tokens, &d->fwd, err);
        if (rc == 0) {
            d->logits = malloc((size_t)max_seqs * (size_t)m->config.vocab_size * sizeof(float));
            d->entries = calloc((size_t)max_seqs, sizeof *d->entries);
            d->owner = calloc((size_t)max_seqs, sizeof *d->owner);
            d->survey = calloc((size_t)d->n_buckets, sizeof *d->survey);
            if (!d->logits || !d->entries || !d->owner || !d->survey)
                rc = err_set(err, INFERD_ENOMEM, "out of memory for the draft model's buffers");
        }
    }
    if (rc < 0) {
        spec_drafter_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void spec_drafter_free(struct spec_drafter *d)
{
    if (!d)
        return;
    free(d->logits);
    free(d->entries);
    free(d->owner);
    free(d->survey);
    forward_state_free(d->fwd);
    kv_manager_destroy(d->kv);
    free(d);
}

int spec_drafter_max(const struct spec_drafter *d) { return d->max_drafts; }
uint64_t spec_drafter_steps(const struct spec_drafter *d) { return d->steps; }
int spec_drafter_head_rows(const struct spec_drafter *d)
{
    return d ? atomic_load_explicit(&d->head_rows, memory_order_relaxed) : 0;
}

void spec_seq_init(const struct spec_drafter *d, struct seq *s, bool speculative)
{
    struct seq_spec *sp = &s->spec;
    kv_seq_init(&sp->dkv);
    sp->on = d && speculative && !s->think.on &&
             !(s->sampler && s->sampler->params.xtc_probability > 0);
    sp->rate = 0.5f; /* no evidence either way */
    memset(sp->reached, 0, sizeof sp->reached);
    memset(sp->kept, 0, sizeof sp->kept);
    /* a few drafts first; a drafter that keeps matching earns the rest quickly */
    sp->k = d ? (d->max_drafts < SPEC_DRAFTS_START ? d->max_drafts : SPEC_DRAFTS_START) : 0;
}

void spec_seq_release(struct spec_drafter *d, struct seq *s)
{
    if (d && d->kv)
        kv_manager_free(d->kv, &s->spec.dkv);
    s->spec.d_valid = 0;
    s->spec.n_drafts = 0;
}

/* ---- prompt lookup --------------------------------------------------------- */

int spec_ngram_lookup(const int32_t *tokens, int n, int min_n, int max_n, int32_t *out, int cap)
{
    for (int len = max_n < n - 1 ? max_n : n - 1; len >= min_n; len--) {
        const int32_t *suffix = tokens + n - len;
        /* the latest earlier occurrence that has a continuation */
        for (int start = n - len - 1; start >= 0; start--) {
            if (memcmp(tokens + start, suffix, (size_t)len * sizeof *tokens) != 0)
                continue;
            int from = start + len, m = 0;
            while (m < cap && from + m < n)
                out[m] = tokens[from + m], m++;
            return m;
        }
    }
    return 0;
}

/* ---- proposals ------------------------------------------------------------- */

/* How many drafts s may carry now: its adaptive k, what it may still generate (the verify
 * entry yields one token more than it drafts) and the context. */
static int draft_room(const struct spec_drafter *d, const struct seq *s, int n_ctx)
{
    int k = s->spec.k < d->max_drafts ? s->spec.k : d->max_drafts;
    /* Greedy picks: at most the number the measured costs make best. A sampling sequence's
     * drafts decide which random numbers its picks use, so its number must not follow
     * timings: a seed gives the same tokens every time. A caller's own drafter
     * (SPEC_CALLBACK) has its drafts verified as it places them. */
    if (d->cfg.kind != SPEC_CALLBACK && (!s->sampler || sampler_is_greedy(s->sampler))) {
        /* each position's chance of a kept draft, the position before's weighing as two
         * verifications (a half at the first) */
        double keep[SPEC_MAX_DRAFTS], prior = 0.5;
        for (int i = 0; i < d->max_drafts; i++) {
            keep[i] = (s->spec.kept[i] + 2.0 * prior) / (s->spec.reached[i] + 2.0);
            prior = keep[i];
        }
        double cost[SPEC_MAX_DRAFTS + 2];
        spec_costs_current(&d->verify, cost);
        int best = spec_best_drafts(keep, cost, d->max_drafts, d->draft_cost);
        k = k < best ? k : best;
    }
    int left = s->max_tokens - (s->n_tokens - s->n_prompt) - 1;
    int ctx_left = n_ctx - s->n_tokens - 1;
    k = k < left ? k : left;
    k = k < ctx_left ? k : ctx_left;
    return k > 0 ? k : 0;
}

static bool is_eos(const struct seq *s, int32_t id)
{
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos_ids[i] == id)
            return true;
    return false;
}

/* Cuts s's drafts after an end-of-sequence token, at a token outside the vocabulary, and at
 * the first one its grammar refuses (checked on the matcher, then rolled back): the target
 * would never pick it, so verifying it is wasted. */
static void cut_drafts(struct seq *s, int n_vocab)
{
    struct seq_spec *sp = &s->spec;
    bool grammar = constrain_on(&s->con) && s->con.m;
    int keep = 0, in_matcher = 0;
    while (keep < sp->n_drafts) {
        int32_t t = sp->verify[1 + keep];
        if (t < 0 || t >= n_vocab)
            break;
        if (is_eos(s, t)) {
            keep++;
            break;
        }
        if (grammar) {
            if (grammar_matcher_accept_token(s->con.m, t) < 0)
                break;
            in_matcher++;
        }
        keep++;
        if (grammar && grammar_matcher_is_finished(s->con.m))
            break; /* a next stage takes over from here: its drafts are not checked */
    }
    if (in_matcher > 0)
        grammar_matcher_rollback(s->con.m, in_matcher);
    sp->n_drafts = keep;
}

int spec_surveyed_rows(const float *survey, int n_buckets, int vocab)
{
    double total = 0.0;
    for (int i = 0; i < n_buckets; i++)
        total += survey[i];
    if (total <= 0.0)
        return vocab;
    double held = 0.0;
    for (int i = 0; i < n_buckets; i++) {
        held += survey[i];
        if (held >= SPEC_SURVEY_SHARE * total) {
            int rows = (i + 1) * SPEC_SURVEY_BUCKET;
            return rows < vocab ? rows : vocab;
        }
    }
    return vocab;
}

/* Draft model forward over the entries gathered; false on failure (err filled). With an
 * automatic head (cfg.draft_vocab 0), a forward with logits either surveys (the whole head,
 * its picks counted) or reads the rows the surveys so far chose. */
static int draft_forward(struct spec_drafter *d, int n, struct err *err)
{
    int vocab = d->cfg.draft->config.vocab_size;
    bool logits = false;
    for (int i = 0; i < n; i++)
        logits |= !d->entries[i].no_logits;
    if (d->auto_head && logits) {
        if (d->surveying && d->forwards >= SPEC_SURVEY_EVERY) /* the last one's picks are in */
            d->head_rows = spec_surveyed_rows(d->survey, d->n_buckets, vocab);
        d->surveying = d->forwards % SPEC_SURVEY_EVERY == 0 || d->forwards < SPEC_SURVEY_EVERY;
        if (d->surveying)
            for (int i = 0; i < d->n_buckets; i++)
                d->survey[i] *= SPEC_SURVEY_DECAY;
        d->forwards++;
    }
    d->pick_rows = d->surveying ? vocab : d->head_rows;
    struct batch b = {d->entries, n};
    struct forward_output out = {.host_rows = d->logits, .head_rows = d->pick_rows};
    d->steps++;
    return model_forward_sampled(d->cfg.draft, d->fwd, kv_manager_cache(d->kv), &b, &out, err);
}

/* The draft's greedy pick from a row of the last forward, counted when it surveys. */
static int32_t draft_pick(struct spec_drafter *d, const float *row)
{
    int32_t id = logits_argmax(row, d->pick_rows);
    if (d->surveying && id >= 0)
        d->survey[id / SPEC_SURVEY_BUCKET] += 1.0f;
    return id;
}

/* Gives up drafting for s this step (its draft KV is recomputed later if it must be). */
static void drop(struct spec_drafter *d, struct seq *s)
{
    spec_seq_release(d, s);
}

/* Drops what the draft computed of s past the tokens it is known to share with the target. */
static void forget_unshared(struct spec_drafter *d, struct seq *s)
{
    if (s->spec.dkv.n_tokens > s->spec.d_valid)
        kv_manager_truncate(d->kv, &s->spec.dkv, s->spec.d_valid);
    s->spec.d_valid = s->spec.dkv.n_tokens;
}

/* The draft reads each sequence's tokens it has not seen, up to upto[i] (0: none), in chunks
 * of the step's budget, all sequences in the same forwards. With logits, the row of a
 * sequence's last token gives its first draft (verify[1], n_drafts 1); without, no row is
 * made. A failed forward gives up the sequences it carried (their draft KV is recomputed
 * later) and returns its error. */
static int catch_up(struct spec_drafter *d, struct seq **seqs, const int *upto, int n, bool logits,
                    struct err *err)
{
    size_t vocab = (size_t)d->cfg.draft->config.vocab_size;
    for (;;) {
        int m = 0, budget = d->max_step_tokens;
        for (int i = 0; i < n && m < d->max_seqs && budget > 0; i++) {
            struct seq *s = seqs[i];
            int todo = upto[i] - s->spec.dkv.n_tokens;
            if (todo <= 0)
                continue;
            int chunk = todo < budget ? todo : budget;
            struct err aerr = {0};
            if (kv_manager_allocate_slots(d->kv, &s->spec.dkv, chunk, &aerr) < 0)
                continue;
            d->owner[m] = s;
            d->entries[m++] = (struct batch_seq){
                .tokens = s->tokens + s->spec.dkv.n_tokens - chunk,
                .n_tokens = chunk,
                .pos0 = s->spec.dkv.n_tokens - chunk,
                .block_ids = s->spec.dkv.table.blocks,
                .n_block_ids = s->spec.dkv.table.n_blocks,
                .no_logits = !logits || s->spec.dkv.n_tokens < upto[i],
            };
            budget -= chunk;
        }
        if (m == 0)
            return 0;
        int rc = draft_forward(d, m, err);
        int row = 0;
        for (int j = 0; j < m; j++) {
            struct seq *s = d->owner[j];
            if (rc < 0) {
                drop(d, s);
                continue;
            }
            s->spec.d_valid = s->spec.dkv.n_tokens;
            if (d->entries[j].no_logits)
                continue;
            s->spec.verify[1] = draft_pick(d, d->logits + (size_t)row++ * vocab);
            s->spec.n_drafts = 1;
        }
        if (rc < 0)
            return rc;
    }
}

int spec_follow(struct spec_drafter *d, struct seq **seqs, const int *upto, int n,
                struct err *err)
{
    if (d->cfg.kind != SPEC_TWO_MODEL)
        return 0;
    for (int i = 0; i < n; i++)
        forget_unshared(d, seqs[i]);
    return catch_up(d, seqs, upto, n, false, err);
}

/* The draft model's proposals: every sequence's tokens the draft has not seen (the prompt in
 * chunks when the target's prefill did not take it along, later the last verification's
 * tokens), then greedy steps until each has its k drafts; all sequences share each draft
 * forward. */
static int propose_two_model(struct spec_drafter *d, struct seq **seqs, const int *want, int n,
                             struct err *err)
{
    size_t vocab = (size_t)d->cfg.draft->config.vocab_size;
    int upto[256];
    for (int i = 0; i < n; i++) {
        struct seq *s = seqs[i];
        forget_unshared(d, s);
        s->spec.n_drafts = 0;
        upto[i] = want[i] > 0 ? s->n_tokens : 0;
    }
    /* catch up to every token, the pending one included; its row gives the first draft */
    int rc = catch_up(d, seqs, upto, n, true, err);
    if (rc < 0)
        return rc;
    /* then one greedy step per further draft */
    for (int step = 1;; step++) {
        int m = 0;
        for (int i = 0; i < n; i++) {
            struct seq *s = seqs[i];
            if (s->spec.n_drafts != step || step >= want[i] || m == d->max_seqs)
                continue;
            struct err aerr = {0};
            if (kv_manager_allocate_slots(d->kv, &s->spec.dkv, 1, &aerr) < 0)
                continue;
            d->owner[m] = s;
            d->entries[m++] = (struct batch_seq){
                .tokens = &s->spec.verify[step],
                .n_tokens = 1,
                .pos0 = s->spec.dkv.n_tokens - 1,
                .block_ids = s->spec.dkv.table.blocks,
                .n_block_ids = s->spec.dkv.table.n_blocks,
            };
        }
        if (m == 0)
            break;
        int rc = draft_forward(d, m, err);
        for (int j = 0; j < m; j++) {
            struct seq *s = d->owner[j];
            if (rc < 0) {
                drop(d, s);
                continue;
            }
            s->spec.verify[1 + step] = draft_pick(d, d->logits + (size_t)j * vocab);
            s->spec.n_drafts = step + 1;
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

int spec_propose(struct spec_drafter *d, struct seq **seqs, int n, int n_ctx, struct err *err)
{
    int want[256];
    int rc = 0;
    for (int start = 0; start < n && rc == 0; start += 256) {
        int m = n - start < 256 ? n - start : 256;
        for (int i = 0; i < m; i++) {
            struct seq *s = seqs[start + i];
            s->spec.n_drafts = 0;
            want[i] = 0;
            if (s->spec.rest > 0) {
                s->spec.rest--;
                continue;
            }
            want[i] = draft_room(d, s, n_ctx);
            if (want[i] > 0 && d->cfg.kind == SPEC_NGRAM)
                s->spec.n_drafts = spec_ngram_lookup(s->tokens, s->n_tokens, d->cfg.ngram_min,
                                                     d->cfg.ngram_max, s->spec.verify + 1,
                                                     want[i]);
            else if (want[i] > 0 && d->cfg.kind == SPEC_CALLBACK)
                s->spec.n_drafts = d->cfg.draft_fn(d->cfg.draft_ctx, s->tokens, s->n_tokens,
                                                   s->spec.verify + 1, want[i]);
        }
        if (d->cfg.kind == SPEC_TWO_MODEL)
            rc = propose_two_model(d, seqs + start, want, m, err);
        for (int i = 0; i < m; i++) {
            struct seq *s = seqs[start + i];
            if (s->spec.n_drafts > want[i])
                s->spec.n_drafts = want[i];
            int vocab = s->sampler ? s->sampler->n_vocab : 1 << 30;
            cut_drafts(s, vocab);
        }
    }
    return rc;
}

/* ---- after verification ---------------------------------------------------- */

void spec_after_verify(struct spec_drafter *d, struct seq *s, int n_drafts, int n_accepted)
{
    struct seq_spec *sp = &s->spec;
    sp->drafted += (uint64_t)n_drafts;
    sp->accepted += (uint64_t)n_accepted;
    sp->verify_steps++;
    if (d->kv) {
        /* the draft holds the pending token and the drafts before the last; the kept ones
         * are exactly the target's kept positions */
        if (sp->dkv.n_tokens > s->n_computed)
            kv_manager_truncate(d->kv, &sp->dkv, s->n_computed);
        sp->d_valid = sp->dkv.n_tokens;
    }
    /* Adaptive k: twice as many after a full acceptance (up to the most); after a step that
     * kept fewer than half, one more than it kept (a drafter that stops matching costs few
     * rows at once). While the acceptance rate's moving average is under a quarter, drafting
     * pauses for 8, then 16, 32 and 64 steps, so a sequence the drafter cannot predict costs
     * its batch almost nothing, while one that is right half the time keeps drafting. */
    if (n_accepted == n_drafts)
        sp->k = 2 * sp->k < d->max_drafts ? 2 * sp->k : d->max_drafts;
    else if (2 * n_accepted < n_drafts)
        sp->k = n_accepted + 1;
    if (n_drafts > 0) {
        sp->rate = 0.7f * sp->rate + 0.3f * (float)n_accepted / (float)n_drafts;
        for (int i = 0; i <= n_accepted && i < n_drafts; i++) {
            sp->reached[i] = 0.9f * sp->reached[i] + 1.0f;
            sp->kept[i] = 0.9f * sp->kept[i] + (i < n_accepted ? 1.0f : 0.0f);
        }
    }
    if (sp->rate >= 0.25f) {
        sp->misses = 0;
    } else {
        int shift = sp->misses < 3 ? sp->misses : 3;
        sp->rest = 8 << shift;
        sp->misses++;
    }
}

/* ---- what drafting costs ----------------------------------------------------- */

static void average_into(double *avg, double seconds)
{
    *avg = *avg > 0.0 ? 0.8 * *avg + 0.2 * seconds : seconds;
}

void spec_costs_note(struct spec_costs *c, int rows, double seconds)
{
    if (rows < 0 || rows >= SPEC_MAX_DRAFTS + 2 || seconds <= 0.0)
        return;
    c->timed++;
    if (c->timed - c->timed_at[rows] > SPEC_COST_STALE)
        c->step[rows] = 0.0; /* stale: this measurement replaces it */
    average_into(&c->step[rows], seconds);
    c->timed_at[rows] = c->timed;
}

void spec_costs_current(const struct spec_costs *c, double *out)
{
    for (int r = 0; r < SPEC_MAX_DRAFTS + 2; r++)
        out[r] = c->timed - c->timed_at[r] <= SPEC_COST_STALE ? c->step[r] : 0.0;
}

void spec_note_step(struct spec_drafter *d, int rows, double seconds)
{
    if (d && rows >= 2 && rows <= d->max_drafts + 1)
        spec_costs_note(&d->verify, rows, seconds);
}

void spec_note_drafting(struct spec_drafter *d, uint64_t forwards, double seconds)
{
    if (d && forwards > 0 && seconds > 0.0)
        average_into(&d->draft_cost, seconds / (double)forwards);
}

/* An unmeasured neighbour is worth a step of measuring only where it could bring this much
 * more than the best measured: at most 2% less is noise, not a reason to leave the best. */
#define SPEC_EXPLORE_GAIN 1.02

int spec_best_drafts(const double *keep, const double *step_cost, int max_drafts,
                     double draft_cost)
{
    /* tokens[k]: expected tokens of a verify with k drafts */
    double tokens[SPEC_MAX_DRAFTS + 2], all_kept = 1.0, best_rate = 0.0;
    int best = 0;
    tokens[0] = 1.0;
    for (int k = 1; k <= max_drafts; k++) {
        all_kept *= keep[k - 1];
        tokens[k] = tokens[k - 1] + all_kept;
        if (step_cost[1 + k] <= 0.0)
            continue;
        double rate = tokens[k] / (step_cost[1 + k] + k * draft_cost);
        if (rate > best_rate) {
            best_rate = rate;
            best = k;
        }
    }
    if (best == 0)
        return max_drafts; /* nothing to weigh yet */
    /* A neighbour of the best while it is unmeasured, where its most hopeful rate beats the
     * best's: a step's cost grows at most in proportion to its rows (a row fewer saves at
     * most a row's share), and a row more costs at least nothing. Otherwise a sequence whose
     * drafts are kept at every count would stay at the first count measured. */
    const double c = step_cost[1 + best];
    if (best > 1 && step_cost[best] <= 0.0) {
        double low = c * best / (best + 1.0) + (best - 1) * draft_cost;
        if (tokens[best - 1] / low > SPEC_EXPLORE_GAIN * best_rate)
            return best - 1;
    }
    if (best < max_drafts && step_cost[2 + best] <= 0.0) {
        double low = c + (best + 1) * draft_cost;
        if (tokens[best + 1] / low > SPEC_EXPLORE_GAIN * best_rate)
            return best + 1;
    }
    return best;
}
