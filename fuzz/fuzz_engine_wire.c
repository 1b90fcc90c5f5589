/* fuzz/fuzz_engine_wire.c — libFuzzer target: the supervisor ⇄ engine child frame stream
 * (api/engine_wire.h): frames parsed one after another, each decoded as its type says and, what
 * decodes, encoded again and decoded to the same fields. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/engine_wire.h"

static void submit_again(const struct engine_wire_submit *s)
{
    if (s->p.n_prompt < 0 || s->p.n_stop > GEN_MAX_STOP)
        __builtin_trap();
    for (int i = 0; i < s->p.n_stop; i++)
        if (!s->p.stop[i])
            __builtin_trap();
    struct strbuf b = {0};
    /* a grammar travels as its source, beside a compiled one the sender holds */
    struct gen_params p = s->p;
    bool has_grammar = s->grammar.kind != STRUCTURED_NONE;
    if (has_grammar && !s->grammar.text)
        __builtin_trap();
    p.grammar = has_grammar ? (struct gen_grammar *)&p : NULL; /* never dereferenced */
    if (engine_wire_put_submit(&b, s->id, &p, has_grammar ? &s->grammar : NULL, s->adapter)) {
        struct engine_wire_frame f;
        size_t used = 0;
        struct engine_wire_submit t;
        if (engine_wire_parse((const uint8_t *)b.data, b.len, &f, &used, NULL) != 1 ||
            engine_wire_get_submit(&f, &t, NULL) != 0 || t.p.n_prompt != s->p.n_prompt ||
            t.p.n_stop != s->p.n_stop || t.id != s->id || t.grammar.kind != s->grammar.kind ||
            (has_grammar && strcmp(t.grammar.text, s->grammar.text) != 0) ||
            !s->adapter != !t.adapter || (s->adapter && strcmp(s->adapter, t.adapter) != 0))
            __builtin_trap();
        engine_wire_submit_free(&t);
    }
    strbuf_free(&b);
}

/* A reply's adapter lists, encoded again: the same counts and entries. */
static void reply_again(const struct engine_wire_reply *r)
{
    if (r->n_adapters < 0 || r->n_adapters > ENGINE_WIRE_MAX_ADAPTERS || r->n_found < 0 ||
        r->n_found > ENGINE_WIRE_MAX_ADAPTERS || !r->adapters != !r->n_adapters ||
        !r->found != !r->n_found)
        __builtin_trap();
    for (int i = 0; i < r->n_adapters; i++)
        if (strlen(r->adapters[i].id) >= sizeof r->adapters[i].id)
            __builtin_trap();
    struct strbuf b = {0};
    if (engine_wire_put_reply(&b, r)) {
        struct engine_wire_frame f;
        size_t used = 0;
        struct engine_wire_reply *t = malloc(sizeof *t);
        if (t) {
            if (engine_wire_parse((const uint8_t *)b.data, b.len, &f, &used, NULL) != 1 ||
                engine_wire_get_reply(&f, t, NULL) != 0 || t->n_adapters != r->n_adapters ||
                t->n_found != r->n_found ||
                (r->n_adapters && memcmp(t->adapters, r->adapters,
                                         (size_t)r->n_adapters * sizeof *r->adapters) != 0))
                __builtin_trap();
            engine_wire_reply_free(t);
            free(t);
        }
    }
    strbuf_free(&b);
}

static void event_again(const struct engine_wire_event *e)
{
    if (e->news.text && strlen(e->news.text) > e->news.text_len)
        __builtin_trap();
    struct strbuf b = {0};
    if (engine_wire_put_event(&b, e->id, &e->news, e->embedding, e->n_embedding)) {
        struct engine_wire_frame f;
        size_t used = 0;
        struct engine_wire_event t;
        if (engine_wire_parse((const uint8_t *)b.data, b.len, &f, &used, NULL) != 1 ||
            engine_wire_get_event(&f, &t, NULL) != 0 || t.news.n_ids != e->news.n_ids ||
            t.news.n_tokens != e->news.n_tokens || t.n_embedding != e->n_embedding)
            __builtin_trap();
        engine_wire_event_free(&t);
    }
    strbuf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;
    while (off < size) {
        struct engine_wire_frame f;
        size_t used = 0;
        struct err err = {0};
        int rc = engine_wire_parse(data + off, size - off, &f, &used, &err);
        if (rc <= 0)
            break;
        if (used < ENGINE_WIRE_HEADER || used > size - off)
            __builtin_trap();
        off += used;
        switch (f.type) {
        case ENGINE_WIRE_HELLO: {
            struct engine_wire_hello h;
            if (engine_wire_get_hello(&f, &h, &err) == 0 &&
                (h.n_eos < 0 || h.n_eos > SERVER_MAX_EOS || h.cfg.tier || h.cfg.spec))
                __builtin_trap();
            break;
        }
        case ENGINE_WIRE_SUBMIT: {
            struct engine_wire_submit s;
            if (engine_wire_get_submit(&f, &s, &err) == 0)
                submit_again(&s);
            engine_wire_submit_free(&s);
            break;
        }
        case ENGINE_WIRE_SUBMITTED: {
            struct engine_wire_submitted s;
            engine_wire_get_submitted(&f, &s, &err);
            break;
        }
        case ENGINE_WIRE_EVENT: {
            struct engine_wire_event e;
            if (engine_wire_get_event(&f, &e, &err) == 0)
                event_again(&e);
            engine_wire_event_free(&e);
            break;
        }
        case ENGINE_WIRE_CANCEL: {
            uint64_t id;
            engine_wire_get_cancel(&f, &id, &err);
            break;
        }
        case ENGINE_WIRE_CALL: {
            struct engine_wire_call c;
            if (engine_wire_get_call(&f, &c, &err) == 0 &&
                (c.kind < ENGINE_CALL_STATS || c.kind >= ENGINE_CALL_KIND_END))
                __builtin_trap();
            break;
        }
        case ENGINE_WIRE_REPLY: {
            struct engine_wire_reply *r = malloc(sizeof *r);
            if (r && engine_wire_get_reply(&f, r, &err) == 0) {
                if (r->stats.spec_kind || r->stats.state || r->tier.store.dir)
                    __builtin_trap();
                reply_again(r);
            }
            if (r)
                engine_wire_reply_free(r);
            free(r);
            break;
        }
        case ENGINE_WIRE_PROGRESS: {
            struct engine_wire_progress p;
            engine_wire_get_progress(&f, &p, &err);
            break;
        }
        default:
            __builtin_trap(); /* the parser lets no other type through */
        }
    }
    return 0;
}
