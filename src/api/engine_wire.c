/* api/engine_wire.c — the supervisor ⇄ engine child frames: the header, a bounds-checked field
 * reader and writer, and each message's encoding. */
#include "api/engine_wire.h"

#include <stdlib.h>
#include <string.h>

#define NULL_STRING 0xffffffffu
/* Bounds on what a decoder accepts beyond the payload's own length. */
#define MAX_STOP GEN_MAX_STOP
#define MAX_BIAS (1 << 20)

/* ---- writing ---- */

struct writer {
    struct strbuf *out;
    size_t start; /* the frame's header */
    bool ok;
};

static void put_raw(struct writer *w, const void *p, size_t n)
{
    if (w->ok && n)
        w->ok = strbuf_append(w->out, p, n);
}

static void put_u32(struct writer *w, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put_raw(w, b, 4);
}

static void put_u16(struct writer *w, uint16_t v)
{
    uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    put_raw(w, b, 2);
}

static void put_u64(struct writer *w, uint64_t v)
{
    put_u32(w, (uint32_t)v);
    put_u32(w, (uint32_t)(v >> 32));
}

static void put_i32(struct writer *w, int32_t v) { put_u32(w, (uint32_t)v); }

static void put_u8(struct writer *w, uint8_t v) { put_raw(w, &v, 1); }

static void put_bytes(struct writer *w, const void *p, size_t n)
{
    put_u32(w, (uint32_t)n);
    put_raw(w, p, n);
}

static void put_str(struct writer *w, const char *s)
{
    if (!s)
        put_u32(w, NULL_STRING);
    else
        put_bytes(w, s, strlen(s));
}

/* A plain struct: its size first, so a reader of another layout refuses it. */
static void put_blob(struct writer *w, const void *p, size_t size)
{
    put_bytes(w, p, size);
}

static void put_i32s(struct writer *w, const int32_t *v, size_t n)
{
    put_u32(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        put_i32(w, v[i]);
}

/* n plain structs of size bytes each: the size, the count, then the bytes. */
static void put_blobs(struct writer *w, const void *p, size_t size, int32_t n)
{
    put_u32(w, (uint32_t)size);
    put_u32(w, (uint32_t)(n > 0 ? n : 0));
    if (n > 0)
        put_raw(w, p, size * (size_t)n);
}

static struct writer begin(struct strbuf *out, enum engine_wire_type type)
{
    struct writer w = {.out = out, .start = out->len, .ok = true};
    put_u32(&w, ENGINE_WIRE_MAGIC);
    put_u16(&w, ENGINE_WIRE_VERSION);
    put_u16(&w, (uint16_t)type);
    put_u32(&w, 0); /* the length, once known */
    return w;
}

static bool end(struct writer *w)
{
    if (!w->ok)
        return false;
    size_t len = w->out->len - w->start - ENGINE_WIRE_HEADER;
    if (len > ENGINE_WIRE_MAX_PAYLOAD) {
        w->out->len = w->start;
        return false;
    }
    uint8_t *h = (uint8_t *)w->out->data + w->start + 8;
    h[0] = (uint8_t)len, h[1] = (uint8_t)(len >> 8), h[2] = (uint8_t)(len >> 16),
    h[3] = (uint8_t)(len >> 24);
    return true;
}

/* ---- reading ---- */

struct reader {
    const uint8_t *p;
    size_t left;
    bool ok;
};

static const uint8_t *take(struct reader *r, size_t n)
{
    if (!r->ok || n > r->left) {
        r->ok = false;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    r->left -= n;
    return p;
}

static uint32_t rd32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static uint32_t get_u32(struct reader *r)
{
    const uint8_t *b = take(r, 4);
    return b ? rd32(b) : 0;
}

static uint64_t get_u64(struct reader *r)
{
    uint64_t lo = get_u32(r);
    return lo | (uint64_t)get_u32(r) << 32;
}

static int32_t get_i32(struct reader *r) { return (int32_t)get_u32(r); }

static uint8_t get_u8(struct reader *r)
{
    const uint8_t *b = take(r, 1);
    return b ? *b : 0;
}

static void get_blob(struct reader *r, void *dst, size_t size)
{
    if (get_u32(r) != size) {
        r->ok = false;
        return;
    }
    const uint8_t *b = take(r, size);
    if (b)
        memcpy(dst, b, size);
}

/* A string into a fixed buffer (cut to fit; NULL reads as ""). */
static void get_str_into(struct reader *r, char *dst, size_t cap)
{
    uint32_t n = get_u32(r);
    dst[0] = '\0';
    if (n == NULL_STRING || !r->ok)
        return;
    const uint8_t *b = take(r, n);
    if (!b)
        return;
    size_t k = n < cap ? n : cap - 1;
    memcpy(dst, b, k);
    dst[k] = '\0';
}

/* A string allocated (NULL stays NULL); an embedded NUL is refused. */
static char *get_str(struct reader *r, bool *is_null)
{
    uint32_t n = get_u32(r);
    *is_null = n == NULL_STRING;
    if (!r->ok || n == NULL_STRING)
        return NULL;
    const uint8_t *b = take(r, n);
    if (!b)
        return NULL;
    if (memchr(b, '\0', n)) {
        r->ok = false;
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        r->ok = false;
        return NULL;
    }
    memcpy(s, b, n);
    s[n] = '\0';
    return s;
}

/* n (<= max) int32s allocated; NULL for none. */
static int32_t *get_i32s(struct reader *r, uint32_t max, int *n_out)
{
    uint32_t n = get_u32(r);
    *n_out = 0;
    if (!r->ok || n > max || (size_t)n * 4 > r->left) {
        r->ok = false;
        return NULL;
    }
    if (n == 0)
        return NULL;
    int32_t *v = malloc((size_t)n * sizeof *v);
    if (!v) {
        r->ok = false;
        return NULL;
    }
    for (uint32_t i = 0; i < n; i++)
        v[i] = get_i32(r);
    *n_out = (int)n;
    return v;
}

/* put_blobs' array: allocated (NULL for none), of at most ENGINE_WIRE_MAX_ADAPTERS structs of
 * the reader's size. */
static void *get_blobs(struct reader *r, size_t size, int32_t *n_out)
{
    *n_out = 0;
    uint32_t sz = get_u32(r), n = get_u32(r);
    if (!r->ok || sz != size || n > ENGINE_WIRE_MAX_ADAPTERS || (size_t)n * size > r->left) {
        r->ok = false;
        return NULL;
    }
    if (n == 0)
        return NULL;
    void *v = malloc((size_t)n * size);
    const uint8_t *b = take(r, (size_t)n * size);
    if (!v || !b) {
        free(v);
        r->ok = false;
        return NULL;
    }
    memcpy(v, b, (size_t)n * size);
    *n_out = (int32_t)n;
    return v;
}

static int open_frame(const struct engine_wire_frame *f, enum engine_wire_type type,
                      struct reader *r, struct err *err)
{
    if (f->type != type)
        return err_set(err, INFERD_EFORMAT, "engine frame: type %u where %u was expected",
                       f->type, (unsigned)type);
    *r = (struct reader){.p = f->payload, .left = f->len, .ok = true};
    return 0;
}

static int close_frame(const struct reader *r, const char *what, struct err *err)
{
    if (!r->ok)
        return err_set(err, INFERD_EFORMAT, "engine frame %s: a field runs past the payload or "
                       "is out of range", what);
    if (r->left)
        return err_set(err, INFERD_EFORMAT, "engine frame %s: %zu bytes left over", what,
                       r->left);
    return 0;
}

/* ---- frames ---- */

int engine_wire_parse(const uint8_t *buf, size_t n, struct engine_wire_frame *f, size_t *used,
                      struct err *err)
{
    if (n < ENGINE_WIRE_HEADER)
        return 0;
    uint32_t magic = rd32(buf), len = rd32(buf + 8);
    uint16_t version = (uint16_t)(buf[4] | buf[5] << 8), type = (uint16_t)(buf[6] | buf[7] << 8);
    if (magic != ENGINE_WIRE_MAGIC)
        return err_set(err, INFERD_EFORMAT, "engine frame: bad magic 0x%08x", magic);
    if (version != ENGINE_WIRE_VERSION)
        return err_set(err, INFERD_EFORMAT, "engine frame: version %u, this build speaks %u",
                       version, ENGINE_WIRE_VERSION);
    if (type == 0 || type >= ENGINE_WIRE_TYPE_END)
        return err_set(err, INFERD_EFORMAT, "engine frame: unknown type %u", type);
    if (len > ENGINE_WIRE_MAX_PAYLOAD)
        return err_set(err, INFERD_EFORMAT, "engine frame: a %u-byte payload (at most %u)", len,
                       ENGINE_WIRE_MAX_PAYLOAD);
    if (n - ENGINE_WIRE_HEADER < len)
        return 0;
    *f = (struct engine_wire_frame){.version = version, .type = type,
                                    .payload = buf + ENGINE_WIRE_HEADER, .len = len};
    *used = ENGINE_WIRE_HEADER + (size_t)len;
    return 1;
}

bool engine_wire_put_hello(struct strbuf *out, const struct engine_wire_hello *h)
{
    struct engine_config cfg = h->cfg;
    cfg.tier = NULL;
    cfg.spec = NULL;
    struct writer w = begin(out, ENGINE_WIRE_HELLO);
    put_i32(&w, h->pid);
    put_blob(&w, &cfg, sizeof cfg);
    put_u8(&w, h->has_tier);
    put_i32(&w, h->spec_kind);
    put_blob(&w, &h->fit, sizeof h->fit);
    put_blob(&w, &h->defaults, sizeof h->defaults);
    put_i32s(&w, h->eos_ids, (size_t)(h->n_eos > 0 ? h->n_eos : 0));
    put_blob(&w, &h->config, sizeof h->config);
    put_blob(&w, &h->generation, sizeof h->generation);
    put_blob(&w, &h->embedding, sizeof h->embedding);
    put_u8(&w, h->has_adapters);
    return end(&w);
}

int engine_wire_get_hello(const struct engine_wire_frame *f, struct engine_wire_hello *h,
                          struct err *err)
{
    struct reader r = {0};
    int rc = open_frame(f, ENGINE_WIRE_HELLO, &r, err);
    if (rc < 0)
        return rc;
    memset(h, 0, sizeof *h);
    h->pid = get_i32(&r);
    get_blob(&r, &h->cfg, sizeof h->cfg);
    h->cfg.tier = NULL;
    h->cfg.spec = NULL;
    h->has_tier = get_u8(&r) != 0;
    h->spec_kind = get_i32(&r);
    get_blob(&r, &h->fit, sizeof h->fit);
    get_blob(&r, &h->defaults, sizeof h->defaults);
    int n = 0;
    int32_t *eos = get_i32s(&r, SERVER_MAX_EOS, &n);
    if (eos)
        memcpy(h->eos_ids, eos, (size_t)n * sizeof *eos);
    free(eos);
    h->n_eos = n;
    get_blob(&r, &h->config, sizeof h->config);
    get_blob(&r, &h->generation, sizeof h->generation);
    get_blob(&r, &h->embedding, sizeof h->embedding);
    h->has_adapters = get_u8(&r) != 0;
    h->fit.backend_name[sizeof h->fit.backend_name - 1] = '\0';
    h->fit.backend_device[sizeof h->fit.backend_device - 1] = '\0';
    h->config.arch_name[sizeof h->config.arch_name - 1] = '\0';
    h->embedding.mode[sizeof h->embedding.mode - 1] = '\0';
    return close_frame(&r, "HELLO", err);
}

bool engine_wire_put_submit(struct strbuf *out, uint64_t id, const struct gen_params *p,
                            const struct structured_spec *grammar, const char *adapter)
{
    bool has_grammar = grammar && grammar->kind != STRUCTURED_NONE;
    if (!p->grammar != !has_grammar || p->n_adapters != 0 || p->n_prompt < 0 || p->n_stop < 0 || p->n_stop > MAX_STOP ||
        p->n_eos < 0 || p->sampling.n_logit_bias < 0)
        return false;
    struct sampler_params sp = p->sampling;
    sp.logit_bias = NULL;
    struct writer w = begin(out, ENGINE_WIRE_SUBMIT);
    put_u64(&w, id);
    put_i32s(&w, p->prompt, (size_t)p->n_prompt);
    put_i32(&w, p->max_tokens);
    put_blob(&w, &sp, sizeof sp);
    put_u32(&w, (uint32_t)p->sampling.n_logit_bias);
    for (int i = 0; i < p->sampling.n_logit_bias; i++) {
        put_i32(&w, p->sampling.logit_bias[i].token);
        put_raw(&w, &p->sampling.logit_bias[i].bias, sizeof(float));
    }
    put_u32(&w, (uint32_t)p->n_stop);
    for (int i = 0; i < p->n_stop; i++)
        put_str(&w, p->stop[i]);
    put_i32(&w, p->logprobs);
    put_i32s(&w, p->eos_ids, (size_t)p->n_eos);
    put_u64(&w, p->cache_ns);
    put_str(&w, p->session_id);
    put_i32(&w, p->retain_tokens);
    put_u8(&w, p->think_open);
    put_i32(&w, p->think_budget);
    put_u8(&w, p->no_speculation);
    put_u8(&w, p->embed);
    put_u8(&w, has_grammar ? (uint8_t)grammar->kind : STRUCTURED_NONE);
    if (has_grammar) {
        put_u8(&w, grammar->free_whitespace);
        put_u8(&w, p->grammar_after_think);
        put_u8(&w, p->jump_forward);
        put_str(&w, grammar->text ? grammar->text : "");
    }
    put_str(&w, adapter);
    return end(&w);
}

int engine_wire_get_submit(const struct engine_wire_frame *f, struct engine_wire_submit *s,
                           struct err *err)
{
    memset(s, 0, sizeof *s);
    struct reader r = {0};
    int rc = open_frame(f, ENGINE_WIRE_SUBMIT, &r, err);
    if (rc < 0)
        return rc;
    struct gen_params *p = &s->p;
    s->id = get_u64(&r);
    s->prompt = get_i32s(&r, ENGINE_WIRE_MAX_PAYLOAD / 4, &p->n_prompt);
    p->prompt = s->prompt;
    p->max_tokens = get_i32(&r);
    get_blob(&r, &p->sampling, sizeof p->sampling);
    p->sampling.logit_bias = NULL;
    uint32_t n_bias = get_u32(&r);
    p->sampling.n_logit_bias = 0;
    if (n_bias > MAX_BIAS || (size_t)n_bias * 8 > r.left)
        r.ok = false;
    if (r.ok && n_bias) {
        s->bias = calloc(n_bias, sizeof *s->bias);
        if (!s->bias)
            r.ok = false;
        for (uint32_t i = 0; r.ok && i < n_bias; i++) {
            s->bias[i].token = get_i32(&r);
            const uint8_t *b = take(&r, sizeof(float));
            if (b)
                memcpy(&s->bias[i].bias, b, sizeof(float));
        }
        p->sampling.logit_bias = s->bias;
        p->sampling.n_logit_bias = (int)n_bias;
    }
    uint32_t n_stop = get_u32(&r);
    if (n_stop > MAX_STOP)
        r.ok = false;
    if (r.ok && n_stop) {
        s->stop = calloc(n_stop, sizeof *s->stop);
        if (!s->stop)
            r.ok = false;
        for (uint32_t i = 0; r.ok && i < n_stop; i++) {
            bool is_null = false;
            s->stop[i] = get_str(&r, &is_null);
            if (is_null)
                r.ok = false;
            p->n_stop = (int)i + 1;
        }
        p->stop = (const char *const *)s->stop;
    }
    p->logprobs = get_i32(&r);
    if (p->logprobs < -1 || p->logprobs > GEN_MAX_TOP_LOGPROBS)
        r.ok = false;
    s->eos = get_i32s(&r, 1024, &p->n_eos);
    p->eos_ids = s->eos;
    p->cache_ns = get_u64(&r);
    bool is_null = false;
    s->session = get_str(&r, &is_null);
    p->session_id = s->session;
    p->retain_tokens = get_i32(&r);
    p->think_open = get_u8(&r) != 0;
    p->think_budget = get_i32(&r);
    p->no_speculation = get_u8(&r) != 0;
    p->embed = get_u8(&r) != 0;
    uint8_t kind = get_u8(&r);
    if (kind > STRUCTURED_TOOL_CALL)
        r.ok = false;
    else if (r.ok && kind != STRUCTURED_NONE) {
        s->grammar.kind = (enum structured_kind)kind;
        s->grammar.free_whitespace = get_u8(&r) != 0;
        p->grammar_after_think = get_u8(&r) != 0;
        p->jump_forward = get_u8(&r) != 0;
        s->grammar.text = get_str(&r, &is_null);
        if (is_null || !s->grammar.text)
            r.ok = false;
        else
            s->grammar.len = strlen(s->grammar.text);
        s->grammar.param = "response_format";
    }
    s->adapter = get_str(&r, &is_null);
    return close_frame(&r, "SUBMIT", err);
}

void engine_wire_submit_free(struct engine_wire_submit *s)
{
    if (s->stop)
        for (int i = 0; i < s->p.n_stop; i++)
            free(s->stop[i]);
    free(s->stop);
    free(s->prompt);
    free(s->eos);
    free(s->session);
    free(s->bias);
    structured_spec_free(&s->grammar);
    free(s->adapter);
    memset(s, 0, sizeof *s);
}

bool engine_wire_put_submitted(struct strbuf *out, uint64_t id, int rc, const char *msg)
{
    struct writer w = begin(out, ENGINE_WIRE_SUBMITTED);
    put_u64(&w, id);
    put_i32(&w, rc);
    put_str(&w, msg ? msg : "");
    return end(&w);
}

int engine_wire_get_submitted(const struct engine_wire_frame *f, struct engine_wire_submitted *s,
                              struct err *err)
{
    struct reader r = {0};
    int rc = open_frame(f, ENGINE_WIRE_SUBMITTED, &r, err);
    if (rc < 0)
        return rc;
    s->id = get_u64(&r);
    s->rc = get_i32(&r);
    get_str_into(&r, s->msg, sizeof s->msg);
    if (s->rc > 0 || s->rc < -1000)
        r.ok = false;
    return close_frame(&r, "SUBMITTED", err);
}

bool engine_wire_put_event(struct strbuf *out, uint64_t id, const struct gen_news *n,
                           const float *embedding, int n_embedding)
{
    struct writer w = begin(out, ENGINE_WIRE_EVENT);
    put_u64(&w, id);
    put_bytes(&w, n->text, n->text_len);
    put_u64(&w, n->text_from);
    put_u32(&w, (uint32_t)sizeof(struct gen_token));
    put_bytes(&w, n->tokens, n->n_tokens * sizeof *n->tokens);
    put_i32s(&w, n->ids, n->n_ids);
    put_i32(&w, (int32_t)n->finish);
    put_i32(&w, n->n_prompt);
    put_i32(&w, n->n_cached);
    put_i32(&w, n->n_generated);
    put_u64(&w, n->t_admit_ns);
    put_i32(&w, n->error_code);
    put_i32(&w, n->stop_string);
    put_str(&w, n->error);
    put_blob(&w, &n->spec, sizeof n->spec);
    put_bytes(&w, embedding, embedding ? (size_t)n_embedding * sizeof(float) : 0);
    return end(&w);
}

int engine_wire_get_event(const struct engine_wire_frame *f, struct engine_wire_event *e,
                          struct err *err)
{
    memset(e, 0, sizeof *e);
    struct reader r = {0};
    int rc = open_frame(f, ENGINE_WIRE_EVENT, &r, err);
    if (rc < 0)
        return rc;
    struct gen_news *n = &e->news;
    e->id = get_u64(&r);
    uint32_t len = get_u32(&r);
    const uint8_t *text = take(&r, len);
    if (text && len) {
        n->text = malloc((size_t)len + 1);
        if (n->text) {
            memcpy(n->text, text, len);
            n->text[len] = '\0';
            n->text_len = len;
        } else {
            r.ok = false;
        }
    }
    n->text_from = (size_t)get_u64(&r);
    if (get_u32(&r) != sizeof(struct gen_token))
        r.ok = false;
    len = get_u32(&r);
    const uint8_t *tokens = take(&r, len);
    if (r.ok && len % sizeof(struct gen_token))
        r.ok = false;
    if (r.ok && len) {
        n->tokens = malloc(len);
        if (n->tokens) {
            memcpy(n->tokens, tokens, len);
            n->n_tokens = len / sizeof(struct gen_token);
            for (size_t i = 0; i < n->n_tokens; i++)
                if (n->tokens[i].n_top < 0 || n->tokens[i].n_top > GEN_MAX_TOP_LOGPROBS)
                    r.ok = false;
        } else {
            r.ok = false;
        }
    }
    int n_ids = 0;
    n->ids = get_i32s(&r, ENGINE_WIRE_MAX_PAYLOAD / 4, &n_ids);
    n->n_ids = (size_t)n_ids;
    int32_t finish = get_i32(&r);
    if (finish < GEN_RUNNING || finish > GEN_FINISH_ERROR)
        r.ok = false;
    n->finish = (enum gen_finish)finish;
    n->n_prompt = get_i32(&r);
    n->n_cached = get_i32(&r);
    n->n_generated = get_i32(&r);
    n->t_admit_ns = get_u64(&r);
    n->error_code = get_i32(&r);
    n->stop_string = get_i32(&r);
    get_str_into(&r, n->error, sizeof n->error);
    get_blob(&r, &n->spec, sizeof n->spec);
    len = get_u32(&r);
    const uint8_t *emb = take(&r, len);
    if (r.ok && len % sizeof(float))
        r.ok = false;
    if (r.ok && len) {
        e->embedding = malloc(len);
        if (e->embedding) {
            memcpy(e->embedding, emb, len);
            e->n_embedding = (int32_t)(len / sizeof(float));
        } else {
            r.ok = false;
        }
    }
    return close_frame(&r, "EVENT", err);
}

void engine_wire_event_free(struct engine_wire_event *e)
{
    gen_news_free(&e->news);
    free(e->embedding);
    e->embedding = NULL;
    e->n_embedding = 0;
}

bool engine_wire_put_cancel(struct strbuf *out, uint64_t id)
{
    struct writer w = begin(out, ENGINE_WIRE_CANCEL);
    put_u64(&w, id);
    return end(&w);
}

int engine_wire_get_cancel(const struct engine_wire_frame *f, uint64_t *id, struct err *err)
{
    struct reader r = {0};
    int rc = open_frame(f, ENGINE_WIRE_CANCEL, &r, err);
    if (rc < 0)
        return rc;
    *id = get_u64(&r);
    return close_frame(&r, "CANCEL", err);
}

bool engine_wire_put_call(struct strbuf *out, const struct engine_wire_call *c)
{
    struct writer w = begin(out, ENGINE_WIRE_CALL);
    put_u64(&w, c->call);
    put_i32(&w, c->kind);
    put_i32(&w, c->timeout_ms);
    put_str(&w, c->session);
    put_str(&w, c->adapter_id);
    put_str(&w, c->path);
    return end(&w);
}

int engine_wire_get_call(const struct engine_wire_frame *f, struct engine_wire_call *c,
                         struct err *err)
{
    struct reader r = {0};
    int rc = open_frame(f, ENGINE_WIRE_CALL, &r, err);
    if (rc < 0)
        return rc;
    c->call = get_u64(&r);
    c->kind = get_i32(&r);
    c->timeout_ms = get_i32(&r);
    get_str_into(&r, c->session, sizeof c->session);
    get_str_into(&r, c->adapter_id, sizeof c->adapter_id);
    get_str_into(&r, c->path, sizeof c->path);
    if (c->kind < ENGINE_CALL_STATS || c->kind >= ENGINE_CALL_KIND_END)
        r.ok = false;
    return close_frame(&r, "CALL", err);
}

bool engine_wire_put_reply(struct strbuf *out, const struct engine_wire_reply *r)
{
    struct engine_stats st = r->stats;
    st.spec_kind = NULL;
    st.state = NULL;
    st.ssd_cache.store.dir = NULL;
    struct kv_tier_stats tier = r->tier;
    tier.store.dir = NULL;
    struct writer w = begin(out, ENGINE_WIRE_REPLY);
    put_u64(&w, r->call);
    put_i32(&w, r->rc);
    put_i32(&w, r->result);
    put_str(&w, r->msg);
    put_blob(&w, &st, sizeof st);
    put_blob(&w, &tier, sizeof tier);
    put_str(&w, r->spec_kind);
    put_str(&w, r->state);
    put_str(&w, r->ssd_dir);
    put_blobs(&w, r->adapters, sizeof *r->adapters, r->n_adapters);
    put_blobs(&w, r->found, sizeof *r->found, r->n_found);
    return end(&w);
}

int engine_wire_get_reply(const struct engine_wire_frame *f, struct engine_wire_reply *r,
                          struct err *err)
{
    memset(r, 0, sizeof *r);
    struct reader rd = {0};
    int rc = open_frame(f, ENGINE_WIRE_REPLY, &rd, err);
    if (rc < 0)
        return rc;
    r->call = get_u64(&rd);
    r->rc = get_i32(&rd);
    r->result = get_i32(&rd);
    get_str_into(&rd, r->msg, sizeof r->msg);
    get_blob(&rd, &r->stats, sizeof r->stats);
    get_blob(&rd, &r->tier, sizeof r->tier);
    r->stats.spec_kind = NULL;
    r->stats.state = NULL;
    r->stats.ssd_cache.store.dir = NULL;
    r->tier.store.dir = NULL;
    r->stats.kv_quant[sizeof r->stats.kv_quant - 1] = '\0';
    for (int i = 0; i < KV_QUANT_MAX_LAYERS; i++)
        r->stats.kv_quant_layer[i][sizeof r->stats.kv_quant_layer[i] - 1] = '\0';
    r->stats.ssd_cache.cold_format[sizeof r->stats.ssd_cache.cold_format - 1] = '\0';
    r->tier.cold_format[sizeof r->tier.cold_format - 1] = '\0';
    if (r->stats.kv_quant_layers < 0 || r->stats.kv_quant_layers > KV_QUANT_MAX_LAYERS)
        rd.ok = false;
    get_str_into(&rd, r->spec_kind, sizeof r->spec_kind);
    get_str_into(&rd, r->state, sizeof r->state);
    get_str_into(&rd, r->ssd_dir, sizeof r->ssd_dir);
    r->adapters = get_blobs(&rd, sizeof *r->adapters, &r->n_adapters);
    for (int i = 0; i < r->n_adapters; i++) {
        r->adapters[i].id[sizeof r->adapters[i].id - 1] = '\0';
        r->adapters[i].path[sizeof r->adapters[i].path - 1] = '\0';
    }
    r->found = get_blobs(&rd, sizeof *r->found, &r->n_found);
    for (int i = 0; i < r->n_found; i++) {
        r->found[i].id[sizeof r->found[i].id - 1] = '\0';
        r->found[i].path[sizeof r->found[i].path - 1] = '\0';
        r->found[i].base_model[sizeof r->found[i].base_model - 1] = '\0';
    }
    return close_frame(&rd, "REPLY", err);
}

void engine_wire_reply_free(struct engine_wire_reply *r)
{
    free(r->adapters);
    free(r->found);
    r->adapters = NULL;
    r->found = NULL;
    r->n_adapters = r->n_found = 0;
}

bool engine_wire_put_progress(struct strbuf *out, const struct engine_wire_progress *p)
{
    struct writer w = begin(out, ENGINE_WIRE_PROGRESS);
    put_u64(&w, p->steps);
    put_i32(&w, p->active);
    return end(&w);
}

int engine_wire_get_progress(const struct engine_wire_frame *f, struct engine_wire_progress *p,
                             struct err *err)
{
    struct reader r = {0};
    int rc = open_frame(f, ENGINE_WIRE_PROGRESS, &r, err);
    if (rc < 0)
        return rc;
    p->steps = get_u64(&r);
    p->active = get_i32(&r);
    return close_frame(&r, "PROGRESS", err);
}
