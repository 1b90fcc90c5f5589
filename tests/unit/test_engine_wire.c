/* tests/unit/test_engine_wire.c — the supervisor ⇄ engine child frames (api/engine_wire.h):
 * every message survives a round trip, and the parser refuses what is not a frame of this
 * version instead of reading past it. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "api/engine_wire.h"

/* The one frame in b, parsed whole. */
static struct engine_wire_frame only_frame(const struct strbuf *b)
{
    struct engine_wire_frame f;
    size_t used = 0;
    struct err err = {0};
    cr_assert_eq(engine_wire_parse((const uint8_t *)b->data, b->len, &f, &used, &err), 1,
                 "%s", err.msg);
    cr_assert_eq(used, b->len);
    return f;
}

Test(engine_wire, submit_round_trip_keeps_every_field)
{
    int32_t prompt[] = {1, 2, 3, 151643};
    int32_t eos[] = {151645, 151643};
    const char *stop[] = {"</s>", "\n\nUser:"};
    struct sampler_logit_bias bias[] = {{7, -100.0f}, {9, 2.5f}};
    struct gen_params p = {
        .prompt = prompt, .n_prompt = 4, .max_tokens = 33,
        .sampling = {.temperature = 0.7f, .top_k = 40, .top_p = 0.9f, .seed = 1234567890123ull,
                     .logit_bias = bias, .n_logit_bias = 2, .presence_penalty = 0.5f},
        .stop = stop, .n_stop = 2, .logprobs = 3, .eos_ids = eos, .n_eos = 2,
        .cache_ns = 0xfeedfacecafebeefull, .session_id = "s-1", .retain_tokens = 64,
        .think_open = true, .think_budget = 12, .no_speculation = true,
    };
    struct strbuf b = {0};
    cr_assert(engine_wire_put_submit(&b, 42, &p, NULL, NULL));
    struct engine_wire_frame f = only_frame(&b);
    cr_assert_eq(f.type, ENGINE_WIRE_SUBMIT);
    struct engine_wire_submit s;
    struct err err = {0};
    cr_assert_eq(engine_wire_get_submit(&f, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(s.id, 42);
    cr_assert_eq(s.p.n_prompt, 4);
    cr_assert_arr_eq(s.p.prompt, prompt, sizeof prompt);
    cr_assert_eq(s.p.max_tokens, 33);
    cr_assert_float_eq(s.p.sampling.temperature, 0.7f, 1e-9);
    cr_assert_eq(s.p.sampling.top_k, 40);
    cr_assert_eq(s.p.sampling.seed, 1234567890123ull);
    cr_assert_eq(s.p.sampling.n_logit_bias, 2);
    cr_assert_eq(s.p.sampling.logit_bias[1].token, 9);
    cr_assert_float_eq(s.p.sampling.logit_bias[0].bias, -100.0f, 1e-9);
    cr_assert_eq(s.p.n_stop, 2);
    cr_assert_str_eq(s.p.stop[1], "\n\nUser:");
    cr_assert_eq(s.p.logprobs, 3);
    cr_assert_eq(s.p.n_eos, 2);
    cr_assert_eq(s.p.eos_ids[0], 151645);
    cr_assert_eq(s.p.cache_ns, 0xfeedfacecafebeefull);
    cr_assert_str_eq(s.p.session_id, "s-1");
    cr_assert_eq(s.p.retain_tokens, 64);
    cr_assert(s.p.think_open && s.p.no_speculation && !s.p.embed);
    cr_assert_eq(s.p.think_budget, 12);
    cr_assert_null(s.p.grammar);
    engine_wire_submit_free(&s);
    strbuf_free(&b);
}

Test(engine_wire, submit_without_session_stays_null_and_a_grammar_travels_as_its_source)
{
    int32_t prompt[] = {5};
    struct gen_params p = {.prompt = prompt, .n_prompt = 1, .max_tokens = 1, .logprobs = -1};
    struct strbuf b = {0};
    cr_assert(engine_wire_put_submit(&b, 1, &p, NULL, NULL));
    struct engine_wire_frame f = only_frame(&b);
    struct engine_wire_submit s;
    struct err err = {0};
    cr_assert_eq(engine_wire_get_submit(&f, &s, &err), 0, "%s", err.msg);
    cr_assert_null(s.p.session_id);
    cr_assert_eq(s.p.n_stop, 0);
    cr_assert_null(s.adapter);
    engine_wire_submit_free(&s);
    strbuf_free(&b);

    /* a compiled grammar never crosses: without its source the frame is refused */
    p.grammar = (struct gen_grammar *)&p; /* any non-NULL: never dereferenced */
    cr_assert_not(engine_wire_put_submit(&b, 2, &p, NULL, NULL));
    strbuf_free(&b);
    /* and a source without the grammar it was compiled to is a caller's mistake too */
    char schema[] = "{\"type\":\"object\"}";
    struct structured_spec src = {.kind = STRUCTURED_JSON_SCHEMA, .text = schema,
                                  .len = sizeof schema - 1, .free_whitespace = true};
    p.grammar = NULL;
    cr_assert_not(engine_wire_put_submit(&b, 3, &p, &src, NULL));
    strbuf_free(&b);
    /* with both, the source arrives with the grammar's flags; the receiver compiles it */
    p.grammar = (struct gen_grammar *)&p;
    p.grammar_after_think = true;
    p.jump_forward = true;
    cr_assert(engine_wire_put_submit(&b, 4, &p, &src, NULL));
    f = only_frame(&b);
    cr_assert_eq(engine_wire_get_submit(&f, &s, &err), 0, "%s", err.msg);
    cr_assert_null(s.p.grammar);
    cr_assert_eq(s.grammar.kind, STRUCTURED_JSON_SCHEMA);
    cr_assert_str_eq(s.grammar.text, schema);
    cr_assert_eq(s.grammar.len, sizeof schema - 1);
    cr_assert(s.grammar.free_whitespace && s.p.grammar_after_think && s.p.jump_forward);
    engine_wire_submit_free(&s);
    strbuf_free(&b);
}

Test(engine_wire, adapters_cross_as_their_spec_and_the_registry_as_calls_and_lists)
{
    /* a request's adapter spec travels as text; references never do */
    int32_t prompt[] = {5};
    struct gen_params p = {.prompt = prompt, .n_prompt = 1, .max_tokens = 1, .logprobs = -1};
    struct strbuf b = {0};
    cr_assert(engine_wire_put_submit(&b, 9, &p, NULL, "sql+pirate"));
    struct engine_wire_frame f = only_frame(&b);
    struct engine_wire_submit s;
    struct err err = {0};
    cr_assert_eq(engine_wire_get_submit(&f, &s, &err), 0, "%s", err.msg);
    cr_assert_str_eq(s.adapter, "sql+pirate");
    cr_assert_eq(s.p.n_adapters, 0);
    engine_wire_submit_free(&s);
    strbuf_free(&b);
    p.n_adapters = 1; /* resolved references stay in their process */
    cr_assert_not(engine_wire_put_submit(&b, 10, &p, NULL, "sql"));
    strbuf_free(&b);

    struct engine_wire_hello h = {.pid = 1, .has_adapters = true}, g;
    cr_assert(engine_wire_put_hello(&b, &h));
    f = only_frame(&b);
    cr_assert_eq(engine_wire_get_hello(&f, &g, &err), 0, "%s", err.msg);
    cr_assert(g.has_adapters);
    strbuf_free(&b);

    struct engine_wire_call c = {.call = 6, .kind = ENGINE_CALL_ADAPTER_MOUNT}, d;
    snprintf(c.adapter_id, sizeof c.adapter_id, "sql");
    snprintf(c.path, sizeof c.path, "/adapters/qwen3-sql");
    cr_assert(engine_wire_put_call(&b, &c));
    f = only_frame(&b);
    cr_assert_eq(engine_wire_get_call(&f, &d, &err), 0, "%s", err.msg);
    cr_assert_eq(d.kind, ENGINE_CALL_ADAPTER_MOUNT);
    cr_assert_str_eq(d.adapter_id, "sql");
    cr_assert_str_eq(d.path, "/adapters/qwen3-sql");
    strbuf_free(&b);

    static struct engine_wire_reply r, q;
    struct adapter_info infos[2] = {{.id = "sql", .path = "/a/sql", .rank = 16, .scale = 2.0f,
                                     .ram_bytes = 1 << 20, .mounted_modules = 42, .users = 1},
                                    {.id = "pirate", .rank = 8}};
    struct adapter_found found[1] = {{.id = "x", .base_model = "Qwen/Qwen3-4B", .rank = 4,
                                      .mounted = true}};
    r.call = 6;
    r.result = 42;
    r.adapters = infos;
    r.n_adapters = 2;
    r.found = found;
    r.n_found = 1;
    cr_assert(engine_wire_put_reply(&b, &r));
    f = only_frame(&b);
    cr_assert_eq(engine_wire_get_reply(&f, &q, &err), 0, "%s", err.msg);
    cr_assert_eq(q.result, 42);
    cr_assert_eq(q.n_adapters, 2);
    cr_assert_str_eq(q.adapters[0].id, "sql");
    cr_assert_str_eq(q.adapters[0].path, "/a/sql");
    cr_assert_eq(q.adapters[0].rank, 16);
    cr_assert_float_eq(q.adapters[0].scale, 2.0f, 1e-9);
    cr_assert_eq(q.adapters[0].mounted_modules, 42);
    cr_assert_eq(q.adapters[0].users, 1);
    cr_assert_str_eq(q.adapters[1].id, "pirate");
    cr_assert_eq(q.n_found, 1);
    cr_assert_str_eq(q.found[0].base_model, "Qwen/Qwen3-4B");
    cr_assert(q.found[0].mounted);
    engine_wire_reply_free(&q);
    cr_assert_null(q.adapters);
    strbuf_free(&b);

    /* a list longer than the protocol allows is refused, not read */
    r.n_adapters = 0;
    r.n_found = 0;
    cr_assert(engine_wire_put_reply(&b, &r));
    uint8_t *count = (uint8_t *)b.data + b.len - 8 - 4; /* the adapters' count */
    count[0] = 0xff;
    count[1] = 0xff;
    f = only_frame(&b);
    cr_assert_eq(engine_wire_get_reply(&f, &q, &err), -INFERD_EFORMAT);
    engine_wire_reply_free(&q);
    strbuf_free(&b);
}

Test(engine_wire, event_round_trip_keeps_text_tokens_ids_finish_admission_and_embedding)
{
    struct gen_token tok[2] = {{.id = 11, .logprob = -0.5f, .n_top = 1, .text_end = 3},
                               {.id = 12, .logprob = -1.5f, .text_end = 5}};
    tok[0].top[0] = (struct token_logprob){.token = 13, .logprob = -2.0f};
    int32_t ids[] = {11, 12};
    float emb[] = {0.25f, -1.0f, 3.5f};
    struct gen_news n = {.text = "hello", .text_len = 5, .text_from = 7, .tokens = tok,
                         .n_tokens = 2, .ids = ids, .n_ids = 2, .finish = GEN_FINISH_ERROR,
                         .n_prompt = 9, .n_cached = 4, .n_generated = 2,
                         .t_admit_ns = 123456789012345ull, .error_code = 7,
                         .stop_string = 0, .spec = {.drafted = 3, .accepted = 2, .shared = true}};
    snprintf(n.error, sizeof n.error, "boom");
    struct strbuf b = {0};
    cr_assert(engine_wire_put_event(&b, 99, &n, emb, 3));
    struct engine_wire_frame f = only_frame(&b);
    struct engine_wire_event e;
    struct err err = {0};
    cr_assert_eq(engine_wire_get_event(&f, &e, &err), 0, "%s", err.msg);
    cr_assert_eq(e.id, 99);
    cr_assert_eq(e.news.text_len, 5);
    cr_assert_str_eq(e.news.text, "hello");
    cr_assert_eq(e.news.text_from, 7);
    cr_assert_eq(e.news.n_tokens, 2);
    cr_assert_eq(e.news.tokens[0].top[0].token, 13);
    cr_assert_eq(e.news.tokens[1].text_end, 5);
    cr_assert_eq(e.news.n_ids, 2);
    cr_assert_eq(e.news.ids[1], 12);
    cr_assert_eq(e.news.finish, GEN_FINISH_ERROR);
    cr_assert_eq(e.news.n_cached, 4);
    cr_assert_eq(e.news.t_admit_ns, 123456789012345ull);
    cr_assert_eq(e.news.error_code, 7);
    cr_assert_str_eq(e.news.error, "boom");
    cr_assert_eq(e.news.spec.accepted, 2);
    cr_assert(e.news.spec.shared);
    cr_assert_eq(e.n_embedding, 3);
    cr_assert_float_eq(e.embedding[2], 3.5f, 1e-9);
    engine_wire_event_free(&e);
    strbuf_free(&b);
}

Test(engine_wire, hello_reply_call_and_progress_round_trip)
{
    struct engine_wire_hello h = {.pid = 321, .has_tier = true, .spec_kind = 2, .n_eos = 2,
                                  .eos_ids = {5, 6}};
    h.cfg.n_ctx = 4096;
    h.cfg.kv_blocks = 77;
    h.fit.weights_bytes = 1000;
    snprintf(h.config.arch_name, sizeof h.config.arch_name, "Qwen3ForCausalLM");
    h.defaults.max_tokens = 17;
    struct strbuf b = {0};
    cr_assert(engine_wire_put_hello(&b, &h));
    struct engine_wire_frame f = only_frame(&b);
    struct engine_wire_hello g;
    struct err err = {0};
    cr_assert_eq(engine_wire_get_hello(&f, &g, &err), 0, "%s", err.msg);
    cr_assert_eq(g.pid, 321);
    cr_assert(g.has_tier);
    cr_assert_eq(g.cfg.n_ctx, 4096);
    cr_assert_eq(g.cfg.kv_blocks, 77);
    cr_assert_null(g.cfg.tier);
    cr_assert_eq(g.n_eos, 2);
    cr_assert_eq(g.eos_ids[1], 6);
    cr_assert_str_eq(g.config.arch_name, "Qwen3ForCausalLM");
    cr_assert_eq(g.defaults.max_tokens, 17);
    strbuf_free(&b);

    struct engine_wire_call c = {.call = 5, .kind = ENGINE_CALL_CLOSE_SESSION, .timeout_ms = 9};
    snprintf(c.session, sizeof c.session, "sess");
    cr_assert(engine_wire_put_call(&b, &c));
    f = only_frame(&b);
    struct engine_wire_call d;
    cr_assert_eq(engine_wire_get_call(&f, &d, &err), 0, "%s", err.msg);
    cr_assert_eq(d.call, 5);
    cr_assert_eq(d.kind, ENGINE_CALL_CLOSE_SESSION);
    cr_assert_str_eq(d.session, "sess");
    strbuf_free(&b);

    static struct engine_wire_reply r, q;
    r.call = 5;
    r.rc = -7;
    r.result = 3;
    snprintf(r.msg, sizeof r.msg, "busy");
    r.stats.steps = 1234;
    r.stats.spec_kind = "ngram"; /* pointers never cross */
    snprintf(r.spec_kind, sizeof r.spec_kind, "ngram");
    snprintf(r.ssd_dir, sizeof r.ssd_dir, "/var/cache/x");
    cr_assert(engine_wire_put_reply(&b, &r));
    f = only_frame(&b);
    cr_assert_eq(engine_wire_get_reply(&f, &q, &err), 0, "%s", err.msg);
    cr_assert_eq(q.rc, -7);
    cr_assert_eq(q.result, 3);
    cr_assert_str_eq(q.msg, "busy");
    cr_assert_eq(q.stats.steps, 1234);
    cr_assert_null(q.stats.spec_kind);
    cr_assert_str_eq(q.spec_kind, "ngram");
    cr_assert_str_eq(q.ssd_dir, "/var/cache/x");
    strbuf_free(&b);

    struct engine_wire_progress pr = {.steps = 1ull << 40, .active = 3}, ps;
    cr_assert(engine_wire_put_progress(&b, &pr));
    f = only_frame(&b);
    cr_assert_eq(engine_wire_get_progress(&f, &ps, &err), 0, "%s", err.msg);
    cr_assert_eq(ps.steps, 1ull << 40);
    cr_assert_eq(ps.active, 3);
    strbuf_free(&b);
}

Test(engine_wire, partial_frames_wait_for_more_bytes)
{
    struct strbuf b = {0};
    cr_assert(engine_wire_put_cancel(&b, 77));
    cr_assert(engine_wire_put_cancel(&b, 78));
    size_t one = b.len / 2;
    struct engine_wire_frame f;
    size_t used = 0;
    struct err err = {0};
    for (size_t n = 0; n < one; n++)
        cr_assert_eq(engine_wire_parse((const uint8_t *)b.data, n, &f, &used, &err), 0,
                     "%zu bytes are not a whole frame", n);
    cr_assert_eq(engine_wire_parse((const uint8_t *)b.data, b.len, &f, &used, &err), 1);
    cr_assert_eq(used, one, "frames are parsed one at a time");
    uint64_t id = 0;
    cr_assert_eq(engine_wire_get_cancel(&f, &id, &err), 0);
    cr_assert_eq(id, 77);
    cr_assert_eq(engine_wire_parse((const uint8_t *)b.data + used, b.len - used, &f, &used,
                                   &err), 1);
    cr_assert_eq(engine_wire_get_cancel(&f, &id, &err), 0);
    cr_assert_eq(id, 78);
    strbuf_free(&b);
}

/* A copy of a cancel frame with byte i set to v. */
static int parse_patched(size_t i, uint8_t v, struct err *err)
{
    struct strbuf b = {0};
    cr_assert(engine_wire_put_cancel(&b, 1));
    ((uint8_t *)b.data)[i] = v;
    struct engine_wire_frame f;
    size_t used = 0;
    int rc = engine_wire_parse((const uint8_t *)b.data, b.len, &f, &used, err);
    strbuf_free(&b);
    return rc;
}

Test(engine_wire, bad_magic_version_type_or_length_is_a_format_error)
{
    struct err err = {0};
    cr_assert_eq(parse_patched(0, 'X', &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "magic"), "%s", err.msg);
    cr_assert_eq(parse_patched(4, ENGINE_WIRE_VERSION + 1, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "version"), "%s", err.msg);
    cr_assert_eq(parse_patched(6, 0, &err), -INFERD_EFORMAT);
    cr_assert_eq(parse_patched(6, ENGINE_WIRE_TYPE_END, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "type"), "%s", err.msg);
    /* a length past the maximum is refused at once, not waited for */
    cr_assert_eq(parse_patched(11, 0x7f, &err), -INFERD_EFORMAT);
    cr_assert(strstr(err.msg, "payload"), "%s", err.msg);
}

Test(engine_wire, decoders_refuse_short_overlong_or_mistyped_payloads)
{
    struct strbuf b = {0};
    cr_assert(engine_wire_put_progress(&b, &(struct engine_wire_progress){.steps = 1}));
    struct engine_wire_frame f = only_frame(&b);
    struct err err = {0};
    uint64_t id;
    cr_assert_eq(engine_wire_get_cancel(&f, &id, &err), -INFERD_EFORMAT, "another type");
    struct engine_wire_progress pr;
    f.len -= 1;
    cr_assert_eq(engine_wire_get_progress(&f, &pr, &err), -INFERD_EFORMAT, "a short payload");
    strbuf_free(&b);

    cr_assert(engine_wire_put_cancel(&b, 3));
    cr_assert(strbuf_append(&b, "x", 1));
    /* the header says 8 payload bytes: make it 9, the extra byte left over */
    ((uint8_t *)b.data)[8] = 9;
    f = only_frame(&b);
    cr_assert_eq(engine_wire_get_cancel(&f, &id, &err), -INFERD_EFORMAT, "a byte left over");
    cr_assert(strstr(err.msg, "left over"), "%s", err.msg);
    strbuf_free(&b);

    struct engine_wire_call c = {.call = 1, .kind = ENGINE_CALL_KIND_END};
    cr_assert(engine_wire_put_call(&b, &c));
    f = only_frame(&b);
    struct engine_wire_call d;
    cr_assert_eq(engine_wire_get_call(&f, &d, &err), -INFERD_EFORMAT, "an unknown call");
    strbuf_free(&b);
}

Test(engine_wire, a_blob_of_another_size_is_refused)
{
    struct engine_wire_hello h = {.pid = 1};
    struct strbuf b = {0};
    cr_assert(engine_wire_put_hello(&b, &h));
    /* the engine_config blob's size field follows the 4-byte pid */
    uint8_t *size = (uint8_t *)b.data + ENGINE_WIRE_HEADER + 4;
    size[0] ^= 4;
    struct engine_wire_frame f = only_frame(&b);
    struct engine_wire_hello g;
    struct err err = {0};
    cr_assert_eq(engine_wire_get_hello(&f, &g, &err), -INFERD_EFORMAT);
    strbuf_free(&b);
}
