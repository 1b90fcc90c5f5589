/* engine/sequence.c — a request's life inside the engine: sample, decode, match stop strings,
 * stage text for the reader and publish it once per step. */
#include "engine/sequence.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "model/lora.h"

/* Thinking steering for p, when asked for and the tokenizer has both tags: whether the prompt
 * already leaves the model inside <think> is read from its last tag. */
static void think_init(struct seq_think *t, const struct gen_params *p, const struct tokenizer *tok)
{
    memset(t, 0, sizeof *t);
    if ((!p->think_open && p->think_budget <= 0) || !tok)
        return;
    t->start_id = tok_piece_to_id(tok, "<think>");
    t->end_id = tok_piece_to_id(tok, "</think>");
    if (t->start_id < 0 || t->end_id < 0)
        return;
    t->on = true;
    t->budget = p->think_budget > 0 ? p->think_budget : 0;
    for (int i = p->n_prompt - 1; i >= 0; i--) {
        if (p->prompt[i] == t->start_id || p->prompt[i] == t->end_id) {
            t->inside = p->prompt[i] == t->start_id;
            break;
        }
    }
    t->open_first = p->think_open && !t->inside;
}

/* The token that goes out in place of the pick: <think> first when the reply must think,
 * </think> once the thinking budget is spent, else the pick. Tracks the tags either way. */
static int32_t think_steer(struct seq_think *t, int32_t id, bool first)
{
    if (!t->on)
        return id;
    if (first && t->open_first)
        id = t->start_id;
    else if (t->inside && t->budget > 0 && t->count >= t->budget)
        id = t->end_id;
    if (id == t->start_id) {
        t->inside = true;
        t->count = 0;
    } else if (id == t->end_id) {
        t->inside = false;
    } else if (t->inside) {
        t->count++;
    }
    return id;
}

/* Whether the grammar decides the token picked next: it has one, and when it waits for the
 * reasoning part, the model is outside <think> and not about to be steered into it. */
static bool grammar_applies(const struct seq *s)
{
    if (!constrain_on(&s->con))
        return false;
    if (!s->con.after_think || !s->think.on)
        return true;
    return !s->think.inside && !(s->n_tokens == s->n_prompt && s->think.open_first);
}

/* The mask step of the next pick: the grammar's allowed tokens (end-of-sequence only where it
 * accepts) when it applies, else none. Returns 0, 1 when the grammar allows nothing more (the
 * reply is done), or -INFERD_ENOMEM. Computed at creation for the first pick; after each pick
 * it is left due (mask_due) until seq_prepare_pick, which the step runs while the device
 * computes the next forward. */
static int constrain_next(struct seq *s, struct engine_metrics *metrics)
{
    if (!grammar_applies(s))
        return constrain_on(&s->con) ? sampler_set_mask(s->sampler, NULL) : 0;
    int rc = constrain_fill_mask(&s->con, s->eos_ids, s->n_eos, metrics);
    if (rc < 0)
        return rc;
    if (!s->con.any_allowed)
        return 1;
    return sampler_set_mask(s->sampler, s->con.mask);
}

int seq_create(const struct gen_params *p, const struct tokenizer *tok, int n_vocab,
               struct seq **out, struct gen_output **output, struct err *err)
{
    if (p->n_prompt < 1)
        return err_set(err, INFERD_EINVAL, "the prompt is empty");
    if (p->max_tokens < 1)
        return err_set(err, INFERD_EINVAL, "max_tokens must be at least 1");
    if (p->logprobs > GEN_MAX_TOP_LOGPROBS)
        return err_set(err, INFERD_ERANGE, "top_logprobs %d is over %d", p->logprobs,
                       GEN_MAX_TOP_LOGPROBS);
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= n_vocab)
            return err_set(err, INFERD_EINVAL,
                           "prompt token %d is %d, outside the vocabulary [0, %d)", i,
                           p->prompt[i], n_vocab);
    struct seq *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(err, INFERD_ENOMEM, "out of memory for a sequence");
    kv_seq_init(&s->kv);
    int rc = 0;
    s->tokens = malloc(((size_t)p->n_prompt + (size_t)p->max_tokens) * sizeof(int32_t));
    s->eos_ids = malloc(((size_t)p->n_eos + 1) * sizeof(int32_t));
    if (!s->tokens || !s->eos_ids) {
        rc = err_set(err, INFERD_ENOMEM, "out of memory for a sequence");
        goto fail;
    }
    memcpy(s->tokens, p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
    if (p->n_eos > 0)
        memcpy(s->eos_ids, p->eos_ids, (size_t)p->n_eos * sizeof(int32_t));
    s->n_eos = p->n_eos;
    s->kv.ns = p->cache_ns;
    for (int i = 0; i < p->n_adapters; i++) {
        lora_retain(p->adapters[i]);
        s->adapters[s->n_adapters++] = p->adapters[i];
    }
    /* a hint about the prompt: never the generated tokens after it */
    s->kv.n_retain = p->retain_tokens < 0 ? 0 : p->retain_tokens < p->n_prompt ? p->retain_tokens : p->n_prompt;
    think_init(&s->think, p, tok);
    if (p->session_id) {
        if (!(s->session_id = strdup(p->session_id))) {
            rc = err_set(err, INFERD_ENOMEM, "out of memory for a sequence");
            goto fail;
        }
        s->kv.session = s->session_id;
    }
    s->n_prompt = s->n_tokens = p->n_prompt;
    s->max_tokens = p->max_tokens;
    s->logprobs = p->logprobs;
    s->no_speculation = p->no_speculation;
    rc = sampler_init(&s->own_sampler, &p->sampling, n_vocab, err);
    if (rc < 0)
        goto fail;
    s->sampler_ready = true;
    s->sampler = &s->own_sampler;
    if (s->logprobs < 0)
        sampler_skip_logprobs(s->sampler);
    sampler_observe_prompt(s->sampler, p->prompt, p->n_prompt);
    if ((rc = constrain_init(&s->con, p, tok, n_vocab, err)) < 0 ||
        (rc = constrain_next(s, NULL)) < 0) {
        if (rc == -INFERD_ENOMEM)
            err_set(err, INFERD_ENOMEM, "out of memory for a token mask");
        goto fail;
    }
    if ((rc = detok_create(tok, true, &s->detok, err)) < 0)
        goto fail;
    if ((rc = stop_matcher_create(p->stop, p->n_stop, &s->stop, err)) < 0)
        goto fail;
    s->out = gen_output_create(p->n_prompt);
    if (!s->out) {
        rc = err_set(err, INFERD_ENOMEM, "out of memory for a request's output");
        goto fail;
    }
    s->t_submit_ns = now_ns();
    *out = s;
    *output = s->out;
    return 0;
fail:
    seq_free(s, NULL);
    return rc;
}

int seq_create_detached(int n_ctx, struct seq **out, struct err *err)
{
    struct seq *s = calloc(1, sizeof *s);
    if (!s || !(s->tokens = malloc((size_t)n_ctx * sizeof(int32_t)))) {
        free(s);
        return err_set(err, INFERD_ENOMEM, "out of memory for a sequence of %d tokens", n_ctx);
    }
    kv_seq_init(&s->kv);
    s->max_tokens = n_ctx;
    s->logprobs = -1;
    *out = s;
    return 0;
}

void seq_free(struct seq *s, struct kv_manager *kv)
{
    if (!s)
        return;
    if (kv)
        kv_manager_free(kv, &s->kv);
    free(s->kv.table.blocks);
    free(s->spec.dkv.table.blocks);
    if (s->sampler_ready)
        sampler_free(&s->own_sampler);
    constrain_free(&s->con);
    gen_pending_free(&s->pending);
    strbuf_free(&s->records);
    detok_free(s->detok);
    stop_matcher_free(s->stop);
    if (s->out)
        gen_output_release(s->out);
    free(s->tokens);
    free(s->eos_ids);
    free(s->session_id);
    for (int i = 0; i < s->n_adapters; i++)
        lora_release(s->adapters[i]);
    free(s);
}

static bool is_eos(const struct seq *s, int32_t id)
{
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos_ids[i] == id)
            return true;
    return false;
}

/* Adds text (and a token record) to what the reader gets at the end of the
 * step; a failed allocation cancels the request, as the news is lost. */
static void stage(struct seq *s, const char *text, size_t len, bool new_token,
                  const struct gen_token *token)
{
    struct gen_pending *p = &s->pending;
    bool ok = len == 0 || strbuf_append(&p->text, text, len);
    if (new_token)
        p->n_generated++;
    if (token) {
        struct gen_token t = *token;
        t.text_end = p->text.len;
        ok = strbuf_append(&p->tokens, (const char *)&t, sizeof t) && ok;
    }
    if (!ok)
        atomic_store(&s->out->cancel, true);
}

/* Text through the stop matcher to the reader; true when a stop string fired. */
static bool stage_text(struct seq *s, const char *text, size_t len, bool new_token,
                       const struct gen_token *token)
{
    struct err err = {0};
    const char *emit = "";
    size_t emit_len = 0;
    bool stopped = false;
    if (len > 0 && stop_matcher_push(s->stop, text, len, &emit, &emit_len, &stopped, &err) < 0) {
        emit_len = 0;
    }
    stage(s, emit, emit_len, new_token, token);
    return stopped;
}

/* Keeps the token's record for the generation's checkpoints. */
static void keep_record(struct seq *s, const struct gen_token *token, int32_t id)
{
    struct gen_token rec = {.id = id};
    if (!token)
        token = &rec;
    if (!strbuf_append(&s->records, (const char *)token, sizeof *token))
        s->ckpt = false; /* out of memory: this generation goes without checkpoints */
}

/* Appends one token, reports it (with logprobs when asked: the pick's own when sampled, 0
 * for a token jump-forward appended, or as replayed records them) and checks the ways the
 * sequence can end. */
static enum gen_finish push_token(struct seq *s, int32_t id, bool sampled,
                                  const struct gen_token *replayed, int n_ctx,
                                  struct engine_metrics *metrics)
{
    sampler_accept(s->sampler, id);
    s->tokens[s->n_tokens++] = id;

    uint64_t t = now_ns();
    int n_generated = s->n_tokens - s->n_prompt;
    if (metrics) {
        if (n_generated == 1) {
            histogram_observe(&metrics->ttft, (double)(t - s->t_submit_ns) * 1e-9);
            if (s->t_admit_ns)
                histogram_observe(&metrics->prefill_time, (double)(t - s->t_admit_ns) * 1e-9);
        }
        else
            histogram_observe(&metrics->inter_token, (double)(t - s->t_last_token_ns) * 1e-9);
    }
    s->t_last_token_ns = t;

    struct gen_token tk, *token = NULL;
    if (s->logprobs >= 0 && replayed) {
        tk = *replayed;
        token = &tk;
    } else if (s->logprobs >= 0) {
        memset(&tk, 0, sizeof tk);
        tk.id = id;
        if (sampled)
            tk.n_top = sampler_logprobs(s->sampler, id, s->logprobs, &tk.logprob, tk.top);
        token = &tk;
    }
    if (s->ckpt)
        keep_record(s, token, id);

    if (is_eos(s, id)) {
        stage_text(s, NULL, 0, true, token);
        return GEN_FINISH_STOP;
    }
    /* Every id the text came from, so a later prompt can resend them exactly. */
    if (!strbuf_append(&s->pending.ids, (const char *)&id, sizeof id))
        atomic_store(&s->out->cancel, true);
    struct err err = {0};
    const char *text = "";
    size_t len = 0;
    if (detok_push(s->detok, id, &text, &len, &err) < 0)
        len = 0;
    if (stage_text(s, text, len, true, token))
        return GEN_FINISH_STOP;
    if (n_generated >= s->max_tokens || s->n_tokens >= n_ctx)
        return GEN_FINISH_LENGTH;
    return GEN_RUNNING;
}

/* The picked token, steered (thinking) and constrained (structured output: accepted by the
 * grammar, then jump-forward's forced tokens after or in place of it), appended and
 * reported; then the next pick's mask. */
static enum gen_finish emit_token(struct seq *s, int32_t id, const struct gen_token *replayed,
                                  int n_ctx, struct engine_metrics *metrics)
{
    s->last_pick = id;
    if (!s->out) /* detached: its driver accepts the pick and feeds it back */
        return GEN_RUNNING;
    bool constrained = grammar_applies(s);
    id = think_steer(&s->think, id, s->n_tokens == s->n_prompt);
    s->last_pick = id;
    int32_t ids[CONSTRAIN_MAX_JUMP];
    int n_ids = 1;
    ids[0] = id;
    if (constrained && !is_eos(s, id)) {
        /* Only a row with nothing allowed picks outside the mask: the reply is over. */
        if (constrain_accept(&s->con, id) < 0)
            return GEN_FINISH_STOP;
        int left = s->max_tokens - (s->n_tokens - s->n_prompt);
        if (n_ctx - s->n_tokens < left)
            left = n_ctx - s->n_tokens;
        if (!replayed && left > 1)
            n_ids = constrain_jump(&s->con, id, ids, left < CONSTRAIN_MAX_JUMP ? left : CONSTRAIN_MAX_JUMP);
        if (metrics && n_ids > 1)
            atomic_fetch_add(&metrics->grammar_forced, (uint64_t)(n_ids - (ids[0] == id)));
    }
    enum gen_finish why = GEN_RUNNING;
    for (int i = 0; i < n_ids && why == GEN_RUNNING; i++)
        why = push_token(s, ids[i], i == 0 && ids[0] == id, replayed, n_ctx, metrics);
    if (why != GEN_RUNNING || !constrain_on(&s->con))
        return why;
    if (grammar_applies(s) && constrain_finished(&s->con))
        return GEN_FINISH_STOP;
    s->mask_due = true;
    return GEN_RUNNING;
}

void seq_prepare_pick(struct seq *s, struct engine_metrics *metrics)
{
    if (!s->mask_due)
        return;
    s->mask_due = false;
    int rc = constrain_next(s, metrics);
    if (rc == 1) {
        s->grammar_done = true;
    } else if (rc < 0) { /* no mask: this pick must not happen */
        s->pick_void = true;
        atomic_store(&s->out->cancel, true);
    }
}

/* Whether the row in hand may be picked from: its mask is the one for this position (a
 * mask still due was never applied: that pick is void too). Else the finish it brings. */
static bool pick_allowed(struct seq *s, enum gen_finish *why)
{
    if (s->mask_due) {
        s->mask_due = false;
        s->pick_void = true;
        atomic_store(&s->out->cancel, true);
    }
    *why = s->grammar_done ? GEN_FINISH_STOP : GEN_RUNNING;
    return !s->grammar_done && !s->pick_void;
}

enum gen_finish seq_take_token(struct seq *s, const float *logits, int n_ctx, struct engine_metrics *metrics)
{
    seq_prepare_pick(s, metrics);
    enum gen_finish why;
    if (!pick_allowed(s, &why))
        return why;
    return emit_token(s, sampler_pick(s->sampler, logits), NULL, n_ctx, metrics);
}

enum gen_finish seq_take_draft(struct seq *s, const float *logits, int32_t draft, int n_ctx,
                               struct engine_metrics *metrics, bool *accepted)
{
    seq_prepare_pick(s, metrics); /* the position after the previous row's pick */
    enum gen_finish why;
    *accepted = false;
    if (!pick_allowed(s, &why))
        return why;
    return emit_token(s, sampler_pick_draft(s->sampler, logits, draft, NULL, accepted), NULL,
                      n_ctx, metrics);
}

enum gen_finish seq_take_draft_result(struct seq *s, const struct sample_spec *spec,
                                      const struct sample_result *res, const float *host_row,
                                      int32_t draft, int n_ctx, struct engine_metrics *metrics,
                                      bool *accepted)
{
    seq_prepare_pick(s, metrics);
    enum gen_finish why;
    *accepted = false;
    if (!pick_allowed(s, &why))
        return why;
    int32_t pick = sampler_take_result(s->sampler, spec, res, host_row);
    *accepted = pick == draft;
    return emit_token(s, pick, NULL, n_ctx, metrics);
}

bool seq_verify_rows_on_backend(const struct seq *s, const struct sample_spec *spec)
{
    return s->sampler && sampler_is_greedy(s->sampler) && !constrain_on(&s->con) &&
           spec->n_adjust == 0 && !spec->mask;
}

enum gen_finish seq_take_result(struct seq *s, const struct sample_spec *spec,
                                const struct sample_result *res, const float *host_row, int n_ctx,
                                struct engine_metrics *metrics)
{
    enum gen_finish why;
    if (!pick_allowed(s, &why))
        return why;
    return emit_token(s, sampler_take_result(s->sampler, spec, res, host_row), NULL, n_ctx,
                      metrics);
}

enum gen_finish seq_replay(struct seq *s, const struct gen_token *tokens, int n,
                           uint64_t rng_state, int n_ctx)
{
    enum gen_finish why = GEN_RUNNING;
    for (int i = 0; i < n && why == GEN_RUNNING; i++) {
        if (tokens[i].id < 0 || tokens[i].id >= s->sampler->n_vocab)
            return GEN_FINISH_ERROR;
        why = emit_token(s, tokens[i].id, &tokens[i], n_ctx, NULL);
        seq_prepare_pick(s, NULL); /* the grammar's stages advance as they would have */
        if (s->grammar_done)
            why = GEN_FINISH_STOP;
    }
    s->sampler->rng_state = rng_state;
    return why;
}

void seq_finish(struct seq *s, enum gen_finish why, int error_code, const char *error)
{
    if (!s->out)
        return;
    struct err err = {0};
    const char *text = "";
    size_t len = 0;
    bool stopped = stop_matcher_which(s->stop) >= 0;
    if (!stopped && why != GEN_FINISH_ERROR) {
        /* The detokenizer's held-back bytes, then whatever the stop matcher still holds. */
        if (detok_flush(s->detok, &text, &len, &err) == 0 && len > 0)
            stopped = stage_text(s, text, len, false, NULL);
        if (!stopped && stop_matcher_flush(s->stop, &text, &len, &err) == 0 && len > 0)
            stage(s, text, len, false, NULL);
    }
    struct gen_pending *p = &s->pending;
    p->finish = why;
    p->stop_string = why == GEN_FINISH_STOP ? stop_matcher_which(s->stop) + 1 : 0;
    p->error_code = error_code;
    if (error)
        snprintf(p->error, sizeof p->error, "%s", error);
}

void seq_publish(struct seq *s)
{
    if (s->out && !gen_output_publish(s->out, &s->pending))
        atomic_store(&s->out->cancel, true);
}
