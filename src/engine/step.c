/* engine/step.c — one step of the serving loop: the scheduler's batch through the model (or
 * through the backend's sampler, where it samples: then only token ids cross to the host),
 * each sequence's row handed to it, finished ones told and retired (or kept a step more to
 * compute their last token), and each reader woken once: a running sequence's reader while
 * the device computes the next step. */
#include "base/timer.h"
#include "engine/scheduler.h"

/* Whether batch entry b is a speculative verify span (every row's logits). */
static bool verifies(const struct sched *sc, int b)
{
    return sc->spec && sc->batch_seqs[b].all_logits;
}

/* Fills a sample spec for every row of the batch: one for an entry that gets a row, and
 * its first row's for every row of a verify span whose picks the backend may make
 * (seq_verify_rows_on_backend); false when one cannot be filled (out of memory, a driver
 * that reads the logits itself, a verify span the host must pick), and the step then
 * leaves the logits on the host. */
static bool fill_specs(struct sched *sc, int n)
{
    int row = 0;
    for (int b = 0; b < n; b++) {
        struct seq *s = sc->batch_owner[b];
        if (sc->batch_seqs[b].no_logits)
            continue;
        struct sample_spec *spec = &sc->specs[row];
        if (!s->sampler || sampler_fill_spec(s->sampler, s->logprobs, spec) < 0)
            return false;
        if (!verifies(sc, b)) {
            row++;
            continue;
        }
        if (!seq_verify_rows_on_backend(s, spec))
            return false;
        for (int i = 1; i < sc->batch_seqs[b].n_tokens; i++)
            sc->specs[row + i] = *spec;
        row += sc->batch_seqs[b].n_tokens;
    }
    return true;
}

/* A step's host work while the device computes it: the batch's masks due
 * (structured output), then the picks' specs. */
struct step_picks {
    struct sched *sc;
    int n;
    bool on_backend; /* the rows were sampled on the device */
};

static int prepare_picks(void *ctx, bool sampled, struct err *err)
{
    (void)err;
    struct step_picks *p = ctx;
    sched_publish_news(p->sc); /* the last step's, now that this one runs */
    for (int b = 0; b < p->n; b++)
        if (!p->sc->batch_owner[b]->finishing)
            seq_prepare_pick(p->sc->batch_owner[b], p->sc->metrics);
    p->on_backend = sampled && fill_specs(p->sc, p->n);
    return p->on_backend ? 0 : 1;
}

/* The row that predicts s's next token: picked by s's sampler, or left in
 * sc->logits for a detached sequence's driver when it has none. */
static enum gen_finish take_row(struct sched *sc, struct seq *s, size_t row, bool on_backend)
{
    float *logits = sc->logits + row * (size_t)sc->model->config.vocab_size;
    if (!s->sampler)
        return GEN_RUNNING;
    if (on_backend)
        return seq_take_result(s, &sc->specs[row], &sc->results[row], logits, sc->cfg.n_ctx,
                               sc->metrics);
    return seq_take_token(s, logits, sc->cfg.n_ctx, sc->metrics);
}

/* Drafts for every running sequence that decodes one token this step (speculate.h). A
 * failed draft forward costs only the drafts: the step goes on without them. */
static void propose(struct sched *sc)
{
    int m = 0, decoding = 0;
    for (int i = 0; i < sc->n_running; i++) {
        struct seq *s = sc->running[i];
        s->spec.n_drafts = 0;
        decoding += s->n_tokens - s->n_computed == 1;
        if (s->spec.on && s->sampler && !s->loading && !s->continues &&
            s->n_tokens - s->n_computed == 1)
            sc->spec_seqs[m++] = s;
    }
    if (sc->spec_max_batch > 0 && decoding > sc->spec_max_batch)
        return; /* a full batch: plain decoding steps (picked on the device where it samples) */
    if (m == 0)
        return;
    struct err err = {0};
    uint64_t before = spec_drafter_steps(sc->spec);
    double t0 = now_s();
    if (spec_propose(sc->spec, sc->spec_seqs, m, sc->cfg.n_ctx, &err) < 0)
        for (int i = 0; i < m; i++)
            sc->spec_seqs[i]->spec.n_drafts = 0;
    uint64_t forwards = spec_drafter_steps(sc->spec) - before;
    spec_note_drafting(sc->spec, forwards, now_s() - t0);
    atomic_fetch_add(&sc->counters.spec_draft_steps, forwards);
}

/* The draft model reads the prompt chunks the target reads this step (speculate.h), while few
 * enough sequences run for drafting to happen at all, before the target's forward, so the work
 * counts toward the first token as the prompt's own: the first proposal then has only the
 * pending token to read. A failed draft forward costs only that head start. */
static void follow_prefill(struct sched *sc, int n)
{
    if (sc->spec_max_batch > 0 && sc->n_running > sc->spec_max_batch)
        return;
    enum { MAX = 64 };
    struct seq *who[MAX];
    int upto[MAX], m = 0;
    for (int b = 0; b <= n; b++) {
        if (m == MAX || (b == n && m > 0)) {
            struct err err = {0};
            uint64_t before = spec_drafter_steps(sc->spec);
            spec_follow(sc->spec, who, upto, m, &err);
            atomic_fetch_add(&sc->counters.spec_draft_steps,
                             spec_drafter_steps(sc->spec) - before);
            m = 0;
        }
        if (b == n)
            break;
        struct seq *s = sc->batch_owner[b];
        const struct batch_seq *e = &sc->batch_seqs[b];
        /* a prompt chunk of a sequence that may still draft: it generates two tokens more */
        bool may_draft = s->max_tokens - (s->n_tokens - s->n_prompt) > 1;
        if (s->spec.on && s->sampler && !s->loading && !s->continues && !s->finishing &&
            !e->all_logits && s->n_tokens - s->n_computed > 1 && may_draft) {
            who[m] = s;
            upto[m++] = e->pos0 + e->n_tokens;
        }
    }
}

/* A verify entry's rows (speculate.h): row i picks the token after verify[i], taking draft
 * verify[i + 1] while the pick is the draft; the first other pick (or a stop) ends the walk,
 * and after every draft was taken the last row gives one more token. Then only the positions
 * whose tokens are what was computed keep their K/V: the rest is truncated before anything is
 * published. A detached sequence takes the kept drafts into its tokens itself; its driver
 * appends the last pick, and finds every pick in spec.emitted. on_backend: the rows were
 * picked on the device (greedy: fill_specs), only their ids crossed. */
static enum gen_finish take_verify(struct sched *sc, struct seq *s, size_t *row, int chunk,
                                   bool on_backend)
{
    size_t vocab = (size_t)sc->model->config.vocab_size;
    int n_c = s->n_computed, n_drafts = chunk - 1, accepted = 0;
    enum gen_finish why = GEN_RUNNING;
    struct seq_spec *sp = &s->spec;
    sp->n_emitted = 0;
    for (int i = 0; i <= n_drafts; i++) {
        const size_t r = *row + (size_t)i;
        const float *logits = sc->logits + r * vocab;
        if (i == n_drafts) {
            if (on_backend && i > 0)
                seq_prepare_pick(s, sc->metrics); /* this row's position, as take_row's host pick */
            why = take_row(sc, s, r, on_backend);
            sp->emitted[sp->n_emitted++] = s->last_pick;
            break;
        }
        int32_t draft = sp->verify[1 + i];
        int before = s->n_tokens;
        bool ok;
        why = on_backend ? seq_take_draft_result(s, &sc->specs[r], &sc->results[r], logits, draft,
                                                 sc->cfg.n_ctx, sc->metrics, &ok)
                         : seq_take_draft(s, logits, draft, sc->cfg.n_ctx, sc->metrics, &ok);
        sp->emitted[sp->n_emitted++] = s->last_pick;
        if (!ok)
            break;
        accepted++;
        if (!s->out)
            s->tokens[s->n_tokens++] = draft;
        if (why != GEN_RUNNING || s->n_tokens != before + 1)
            break; /* ended, or more was appended (jump-forward): the drafts no longer apply */
    }
    *row += (size_t)chunk;
    int valid = 1;
    while (valid <= n_drafts && n_c + valid < s->n_tokens &&
           s->tokens[n_c + valid] == sp->verify[valid])
        valid++;
    kv_manager_truncate(sc->kv, &s->kv, n_c + valid);
    s->n_computed = n_c + valid;
    spec_after_verify(sc->spec, s, n_drafts, accepted);
    sp->n_drafts = 0;
    s->pending.spec.drafted += n_drafts;
    s->pending.spec.accepted += accepted;
    s->pending.spec.target_calls++;
    atomic_fetch_add(&sc->counters.spec_drafted, (uint64_t)n_drafts);
    atomic_fetch_add(&sc->counters.spec_accepted, (uint64_t)accepted);
    atomic_fetch_add(&sc->counters.spec_verify_steps, 1);
    return why;
}

int sched_step(struct sched *sc, struct err *err)
{
    if (sc->spec)
        propose(sc);
    int n = sched_build_batch(sc);
    if (n == 0) {
        sched_publish_news(sc);
        return 0;
    }
    if (sc->spec)
        follow_prefill(sc, n);
    struct batch batch = {sc->batch_seqs, n};
    struct kv_cache *cache = kv_manager_cache(sc->kv);
    int live = 0; /* entries of running sequences (a finishing one's last token shares nothing) */
    for (int b = 0; b < n; b++)
        live += !sc->batch_owner[b]->finishing;
    struct step_picks picks = {.sc = sc, .n = n};
    struct forward_output out = {
        .host_rows = sc->logits,
        .specs = sc->specs,
        .results = sc->results,
        .before_rows = prepare_picks,
        .ctx = &picks,
    };
    double t_forward = sc->spec ? now_s() : 0.0;
    int rc = model_forward_sampled(sc->model, sc->fwd, cache, &batch, &out, err);
    sched_publish_news(sc); /* when the step had no rows to pick */
    bool on_backend = picks.on_backend;
    bool overlapped = model_overlaps_host_work(sc->model);
    atomic_fetch_add(&sc->counters.steps, 1);
    size_t row = 0;
    for (int b = 0; b < n; b++) {
        struct seq *s = sc->batch_owner[b];
        if (s->finishing) { /* its last token's K/V: now the whole sequence is published */
            if (rc >= 0)
                s->n_computed += sc->batch_chunk[b];
            sched_retire_finishing(sc, s, rc >= 0);
            continue;
        }
        enum gen_finish why = GEN_RUNNING;
        if (live > 1)
            s->pending.spec.shared = true;
        if (s->spec.on)
            s->pending.spec.on = true;
        if (rc < 0) {
            why = GEN_FINISH_ERROR;
            s->spec.n_drafts = 0;
        } else if (verifies(sc, b)) {
            why = take_verify(sc, s, &row, sc->batch_chunk[b], on_backend);
            sched_publish(sc, s);
        } else {
            s->n_computed += sc->batch_chunk[b];
            sched_publish(sc, s);
            if (!sc->batch_seqs[b].no_logits)
                why = take_row(sc, s, row++, on_backend);
            else if (sc->batch_seqs[b].hidden_out)
                why = GEN_FINISH_STOP; /* an embedding: its vector is in its output */
        }
        if (why == GEN_FINISH_STOP || why == GEN_FINISH_LENGTH) {
            sched_remove(sc, s);
            sched_finish(sc, s, why);
        } else if (why != GEN_RUNNING) {
            sched_remove(sc, s);
            sched_retire(sc, s, why, rc < 0 ? err->code : 0, rc < 0 ? err->msg : NULL);
        } else {
            sched_checkpoint(sc, s, false);
            if (overlapped)
                sc->unpublished[sc->n_unpublished++] = s; /* while the device computes the next */
            else
                seq_publish(s);
        }
    }
    /* a step that verified one sequence's drafts alone: what its rows cost */
    if (sc->spec && rc >= 0 && n == 1 && sc->batch_seqs[0].all_logits)
        spec_note_step(sc->spec, sc->batch_seqs[0].n_tokens, now_s() - t_forward);
    return rc < 0 ? rc : n;
}
