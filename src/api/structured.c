/* api/structured.c — structured output fields read into a spec, forced tool calls as grammars,
 * and the server-wide LRU cache of compiled constraints. */
#include "api/structured.h"

#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "grammar/grammar.h"

void structured_spec_free(struct structured_spec *s)
{
    free(s->text);
    memset(s, 0, sizeof *s);
}

static int set_text(struct structured_spec *out, enum structured_kind kind, const char *param,
                    const char *text, size_t len)
{
    char *t = malloc(len + 1);
    if (!t)
        return -INFERD_ENOMEM;
    memcpy(t, text, len);
    t[len] = '\0';
    free(out->text);
    out->text = t;
    out->len = len;
    out->kind = kind;
    out->param = param;
    return 0;
}

static int set_json(struct structured_spec *out, enum structured_kind kind, const char *param,
                    json_object *v)
{
    size_t len = 0;
    const char *s = json_object_to_json_string_length(v, JSON_C_TO_STRING_PLAIN, &len);
    return s ? set_text(out, kind, param, s, len) : -INFERD_ENOMEM;
}

/* A schema value: an object, or a string holding one (guided_json's two spellings). */
static int read_schema(const struct json_reader *r, const char *what, json_object **out)
{
    *out = NULL;
    if (!r->v)
        return 0;
    if (json_object_is_type(r->v, json_type_object) || json_object_is_type(r->v, json_type_boolean)) {
        *out = r->v;
        return 0;
    }
    return json_reader_fail(r, INFERD_EINVAL, "must be a JSON Schema object (%s), got %s", what,
                            json_type_phrase(r->v));
}

/* response_format: {"type":"text"} | {"type":"json_object"} | {"type":"json_schema",
 * "json_schema":{"name","schema","strict","any_whitespace"}}. */
static int read_response_format(const struct json_reader *root, struct structured_spec *out)
{
    static const char *const types[] = {"text", "json_object", "json_schema", NULL};
    struct json_reader f, js;
    bool present = false;
    int type = 0, rc;
    if ((rc = json_read_object(root, "response_format", &present, &f)) || !present)
        return rc;
    if ((rc = json_read_enum(&f, "type", JSON_REQUIRED, types, &type)))
        return rc;
    if (type == 0)
        return 0;
    if (type == 1)
        return set_text(out, STRUCTURED_JSON_OBJECT, "response_format", "", 0);
    bool any_ws = false, strict = false;
    const char *name;
    json_object *schema = NULL;
    if ((rc = json_read_object(&f, "json_schema", JSON_REQUIRED, &js)) ||
        (rc = json_read_str(&js, "name", JSON_OPTIONAL, &name, NULL)) ||
        (rc = json_read_bool(&js, "strict", JSON_OPTIONAL, &strict)) ||
        (rc = json_read_bool(&js, "any_whitespace", JSON_OPTIONAL, &any_ws)))
        return rc;
    struct json_reader s = json_reader_member(&js, "schema");
    if ((rc = read_schema(&s, "the reply's schema", &schema)))
        return rc;
    if (!schema)
        return json_reader_fail_plain(&s, INFERD_EINVAL,
                                      "response_format.json_schema.schema is required");
    if ((rc = set_json(out, STRUCTURED_JSON_SCHEMA, "response_format", schema)))
        return rc;
    out->free_whitespace = any_ws;
    return 0;
}

/* guided_choice: a non-empty array of strings, kept as that JSON array. */
static int read_choice(const struct json_reader *root, struct structured_spec *out)
{
    struct json_reader c = json_reader_member(root, "guided_choice");
    if (!c.v)
        return 0;
    if (!json_object_is_type(c.v, json_type_array) || json_object_array_length(c.v) == 0)
        return json_reader_fail(&c, INFERD_EINVAL, "must be a non-empty array of strings, got %s",
                                json_type_phrase(c.v));
    for (size_t i = 0; i < json_object_array_length(c.v); i++) {
        struct json_reader e = json_reader_element(&c, i);
        if (!json_object_is_type(e.v, json_type_string) || json_object_get_string_len(e.v) == 0)
            return json_reader_fail(&e, INFERD_EINVAL, "must be a non-empty string, got %s",
                                    json_type_phrase(e.v));
    }
    return set_json(out, STRUCTURED_CHOICE, "guided_choice", c.v);
}

int structured_read_request(const struct json_reader *root, struct structured_spec *out)
{
    memset(out, 0, sizeof *out);
    /* Lowest precedence first: each field present overrides what came before it. */
    struct structured_spec got[6];
    memset(got, 0, sizeof got);
    const char *s;
    size_t len;
    bool present = false;
    json_object *schema = NULL;
    int rc;
    if ((rc = read_choice(root, &got[0])))
        goto done;
    if ((rc = json_read_str(root, "guided_regex", &present, &s, &len)))
        goto done;
    if (present && (rc = set_text(&got[1], STRUCTURED_REGEX, "guided_regex", s, len)))
        goto done;
    struct json_reader gj = json_reader_member(root, "guided_json");
    if (gj.v && json_object_is_type(gj.v, json_type_string)) {
        json_object *parsed = json_tokener_parse(json_object_get_string(gj.v));
        if (!parsed || !json_object_is_type(parsed, json_type_object)) {
            json_object_put(parsed);
            rc = json_reader_fail_plain(&gj, INFERD_EINVAL, "guided_json must hold a JSON object");
            goto done;
        }
        rc = set_json(&got[2], STRUCTURED_JSON_SCHEMA, "guided_json", parsed);
        json_object_put(parsed);
        if (rc)
            goto done;
    } else if ((rc = read_schema(&gj, "guided_json", &schema)) ||
               (schema && (rc = set_json(&got[2], STRUCTURED_JSON_SCHEMA, "guided_json", schema)))) {
        goto done;
    }
    struct json_reader so = json_reader_member(root, "structured_outputs");
    schema = NULL;
    if ((rc = read_schema(&so, "structured_outputs", &schema)) ||
        (schema && (rc = set_json(&got[3], STRUCTURED_JSON_SCHEMA, "structured_outputs", schema))))
        goto done;
    if ((rc = read_response_format(root, &got[4])))
        goto done;
    present = false;
    if ((rc = json_read_str(root, "guided_grammar", &present, &s, &len)))
        goto done;
    if (present && (rc = set_text(&got[5], STRUCTURED_GRAMMAR, "guided_grammar", s, len)))
        goto done;
    for (int i = 5; i >= 0; i--)
        if (got[i].kind != STRUCTURED_NONE) {
            *out = got[i];
            memset(&got[i], 0, sizeof got[i]);
            break;
        }
done:
    for (int i = 0; i < 6; i++)
        structured_spec_free(&got[i]);
    return rc;
}

int structured_read_text_format(const struct json_reader *format, struct structured_spec *out)
{
    static const char *const types[] = {"text", "json_object", "json_schema", NULL};
    int type = 0, rc;
    bool strict = false;
    const char *name;
    memset(out, 0, sizeof *out);
    if ((rc = json_read_enum(format, "type", JSON_REQUIRED, types, &type)))
        return rc;
    if (type == 0)
        return 0;
    if (type == 1)
        return set_text(out, STRUCTURED_JSON_OBJECT, "text.format", "", 0);
    json_object *schema = NULL;
    struct json_reader s = json_reader_member(format, "schema");
    if ((rc = json_read_str(format, "name", JSON_OPTIONAL, &name, NULL)) ||
        (rc = json_read_bool(format, "strict", JSON_OPTIONAL, &strict)) ||
        (rc = read_schema(&s, "the reply's schema", &schema)))
        return rc;
    if (!schema)
        return json_reader_fail_plain(&s, INFERD_EINVAL, "text.format.schema is required");
    return set_json(out, STRUCTURED_JSON_SCHEMA, "text.format", schema);
}

/* ---- forced tool calls ------------------------------------------------------------------- */

int structured_tool_call_spec(const char *syntax, json_object *tools, const char *name,
                              struct structured_spec *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    json_object *spec = json_object_new_object(), *list = json_object_new_array();
    json_object_object_add(spec, "syntax", json_object_new_string(syntax));
    size_t n = tools ? json_object_array_length(tools) : 0;
    for (size_t i = 0; i < n; i++) {
        json_object *t = json_object_array_get_idx(tools, i), *fn = NULL, *nm = NULL, *params = NULL;
        if (!json_object_object_get_ex(t, "function", &fn))
            fn = t; /* Responses' flat function tools */
        if (!json_object_object_get_ex(fn, "name", &nm) || !json_object_is_type(nm, json_type_string))
            continue;
        if (name && strcmp(json_object_get_string(nm), name))
            continue;
        json_object *e = json_object_new_object();
        json_object_object_add(e, "name", json_object_get(nm));
        if (json_object_object_get_ex(fn, "parameters", &params) && params)
            json_object_object_add(e, "parameters", json_object_get(params));
        json_object_array_add(list, e);
    }
    json_object_object_add(spec, "tools", list);
    int rc = 0;
    if (json_object_array_length(list) == 0)
        rc = err_set(err, INFERD_EINVAL, "tool_choice names no function of tools");
    else if (set_json(out, STRUCTURED_TOOL_CALL, "tool_choice", spec) < 0)
        rc = err_set(err, INFERD_ENOMEM, "out of memory for a tool call's grammar");
    json_object_put(spec);
    return rc;
}

/* One call object's schema: {"name": const, ARGS: parameters}, in that order, nothing else;
 * the parameters' $defs are hoisted to the root (defs), where their $refs point. */
static json_object *call_schema(json_object *tool, const char *args_key, json_object *defs)
{
    json_object *nm = NULL, *params = NULL, *d = NULL;
    json_object_object_get_ex(tool, "name", &nm);
    json_object *p = NULL;
    if (json_object_object_get_ex(tool, "parameters", &params) &&
        json_object_is_type(params, json_type_object)) {
        p = json_object_new_object();
        json_object_object_foreach(params, k, v) {
            if (!strcmp(k, "$defs") || !strcmp(k, "definitions")) {
                d = v;
                continue;
            }
            json_object_object_add(p, k, json_object_get(v));
        }
        if (d && json_object_is_type(d, json_type_object)) {
            json_object_object_foreach(d, dk, dv)
                json_object_object_add(defs, dk, json_object_get(dv));
        }
    } else {
        p = json_tokener_parse("{\"type\":\"object\"}");
    }
    json_object *s = json_object_new_object(), *props = json_object_new_object(),
                *c = json_object_new_object(), *req = json_object_new_array();
    json_object_object_add(c, "const", json_object_get(nm));
    json_object_object_add(props, "name", c);
    json_object_object_add(props, args_key, p);
    json_object_object_add(s, "type", json_object_new_string("object"));
    json_object_object_add(s, "properties", props);
    json_object_array_add(req, json_object_new_string("name"));
    json_object_array_add(req, json_object_new_string(args_key));
    json_object_object_add(s, "required", req);
    json_object_object_add(s, "additionalProperties", json_object_new_boolean(false));
    return s;
}

/* The stages of a forced call: Hermes (and Qwen3-Coder, whose parser takes the Hermes form
 * inside <tool_call>) "<tool_call>\n" + the call object + "\n</tool_call>"; Llama JSON the
 * call object with "parameters"; Mistral a one-element array of call objects. */
static int compile_tool_call(const struct structured_spec *spec, const struct grammar_options *o,
                             struct grammar **stages, int *n_stages, struct err *err)
{
    json_object *root = json_tokener_parse(spec->text), *syn = NULL, *tools = NULL;
    if (!root || !json_object_object_get_ex(root, "syntax", &syn) ||
        !json_object_object_get_ex(root, "tools", &tools)) {
        json_object_put(root);
        return err_set(err, INFERD_EINVAL, "a malformed tool call specification");
    }
    const char *syntax = json_object_get_string(syn);
    bool llama = !strcmp(syntax, "llama_json"), mistral = !strcmp(syntax, "mistral");
    json_object *defs = json_object_new_object(), *any = json_object_new_array();
    for (size_t i = 0; i < json_object_array_length(tools); i++)
        json_object_array_add(any, call_schema(json_object_array_get_idx(tools, i),
                                               llama ? "parameters" : "arguments", defs));
    json_object *call = json_object_new_object();
    json_object_object_add(call, "anyOf", any);
    json_object *schema = call;
    if (mistral) {
        schema = json_object_new_object();
        json_object_object_add(schema, "type", json_object_new_string("array"));
        json_object_object_add(schema, "items", call);
        json_object_object_add(schema, "minItems", json_object_new_int(1));
        json_object_object_add(schema, "maxItems", json_object_new_int(1));
    }
    if (json_object_object_length(defs) > 0)
        json_object_object_add(schema, "$defs", json_object_get(defs));
    json_object_put(defs);
    size_t len = 0;
    const char *text = json_object_to_json_string_length(schema, JSON_C_TO_STRING_PLAIN, &len);
    int rc = 0, n = 0;
    if (!llama && !mistral) {
        static const char open[] = "<tool_call>\n";
        const char *p = open;
        size_t l = sizeof open - 1;
        if ((rc = grammar_compile_choice(&p, &l, 1, o, &stages[n], err)) == 0)
            n++;
    }
    if (rc == 0 && (rc = grammar_compile_json_schema(text, len, o, &stages[n], err)) == 0)
        n++;
    if (rc == 0 && !llama && !mistral) {
        static const char close[] = "\n</tool_call>";
        const char *p = close;
        size_t l = sizeof close - 1;
        if ((rc = grammar_compile_choice(&p, &l, 1, o, &stages[n], err)) == 0)
            n++;
    }
    json_object_put(schema);
    json_object_put(root);
    if (rc < 0) {
        for (int i = 0; i < n; i++)
            grammar_free(stages[i]);
        return rc;
    }
    *n_stages = n;
    return 0;
}

/* A choice spec's JSON array as the compiler's lists. */
static int compile_choice(const struct structured_spec *spec, const struct grammar_options *o,
                          struct grammar **out, struct err *err)
{
    json_object *arr = json_tokener_parse(spec->text);
    int n = arr && json_object_is_type(arr, json_type_array) ? (int)json_object_array_length(arr) : 0;
    const char **choices = calloc((size_t)n + 1, sizeof *choices);
    size_t *lens = calloc((size_t)n + 1, sizeof *lens);
    int rc;
    if (!choices || !lens) {
        rc = err_set(err, INFERD_ENOMEM, "out of memory for guided_choice");
    } else {
        for (int i = 0; i < n; i++) {
            json_object *e = json_object_array_get_idx(arr, (size_t)i);
            choices[i] = json_object_get_string(e);
            lens[i] = (size_t)json_object_get_string_len(e);
        }
        rc = grammar_compile_choice(choices, lens, n, o, out, err);
    }
    free(choices);
    free(lens);
    json_object_put(arr);
    return rc;
}

static int compile_spec(const struct structured_spec *spec, const struct grammar_vocab *vocab,
                        struct gen_grammar **out, struct err *err)
{
    struct grammar_options o = {.free_whitespace = spec->free_whitespace};
    struct grammar *stages[GEN_GRAMMAR_MAX_STAGES] = {0};
    int n = 1, rc;
    switch (spec->kind) {
    case STRUCTURED_JSON_SCHEMA:
        rc = grammar_compile_json_schema(spec->text, spec->len, &o, &stages[0], err);
        break;
    case STRUCTURED_JSON_OBJECT:
        rc = grammar_compile_json_object(&o, &stages[0], err);
        break;
    case STRUCTURED_REGEX:
        rc = grammar_compile_regex(spec->text, spec->len, &o, &stages[0], err);
        break;
    case STRUCTURED_CHOICE:
        rc = compile_choice(spec, &o, &stages[0], err);
        break;
    case STRUCTURED_GRAMMAR:
        rc = grammar_compile_ebnf(spec->text, spec->len, &o, &stages[0], err);
        break;
    case STRUCTURED_TOOL_CALL:
        rc = compile_tool_call(spec, &o, stages, &n, err);
        break;
    default:
        return err_set(err, INFERD_EINVAL, "no structured output was asked for");
    }
    if (rc < 0)
        return rc;
    return gen_grammar_create(stages, n, vocab, out, err);
}

/* ---- the cache ---------------------------------------------------------------------------- */

struct cache_entry {
    uint64_t key;
    struct structured_spec spec; /* owned copy: hits compare the whole content */
    struct gen_grammar *g;       /* one reference (the cache's) */
    uint64_t used;               /* the tick of the last hit */
};

struct grammar_cache {
    pthread_mutex_t mu;
    const struct grammar_vocab *vocab; /* borrowed */
    struct cache_entry *entries;       /* owned; capacity */
    int n, capacity;
    uint64_t tick, hits, misses;
};

int grammar_cache_create(const struct grammar_vocab *vocab, int capacity,
                         struct grammar_cache **out, struct err *err)
{
    if (capacity < 1)
        return err_set(err, INFERD_EINVAL, "the grammar cache holds at least 1 grammar, got %d",
                       capacity);
    struct grammar_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->entries = calloc((size_t)capacity, sizeof *c->entries))) {
        free(c);
        return err_set(err, INFERD_ENOMEM, "out of memory for the grammar cache");
    }
    pthread_mutex_init(&c->mu, NULL);
    c->vocab = vocab;
    c->capacity = capacity;
    *out = c;
    return 0;
}

void grammar_cache_free(struct grammar_cache *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n; i++) {
        gen_grammar_release(c->entries[i].g);
        structured_spec_free(&c->entries[i].spec);
    }
    free(c->entries);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static uint64_t spec_key(const struct structured_spec *s)
{
    uint64_t h = hash_fnv1a_word(HASH_FNV_OFFSET, (uint64_t)s->kind * 2 + s->free_whitespace);
    return hash_fnv1a(h, s->text ? s->text : "", s->len);
}

static bool same_spec(const struct structured_spec *a, const struct structured_spec *b)
{
    return a->kind == b->kind && a->free_whitespace == b->free_whitespace && a->len == b->len &&
           (a->len == 0 || !memcmp(a->text, b->text, a->len));
}

int grammar_cache_get(struct grammar_cache *c, const struct structured_spec *spec,
                      struct gen_grammar **out, struct err *err)
{
    uint64_t key = spec_key(spec);
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++) {
        struct cache_entry *e = &c->entries[i];
        if (e->key == key && same_spec(&e->spec, spec)) {
            e->used = ++c->tick;
            c->hits++;
            gen_grammar_retain(e->g);
            *out = e->g;
            pthread_mutex_unlock(&c->mu);
            return 0;
        }
    }
    c->misses++;
    pthread_mutex_unlock(&c->mu);
    /* Compiled outside the lock: a slow schema never holds up other requests' hits. */
    struct gen_grammar *g;
    int rc = compile_spec(spec, c->vocab, &g, err);
    if (rc < 0)
        return rc;
    struct structured_spec copy = *spec;
    copy.text = malloc(spec->len + 1);
    if (!copy.text) { /* served uncached */
        *out = g;
        return 0;
    }
    memcpy(copy.text, spec->text ? spec->text : "", spec->len);
    copy.text[spec->len] = '\0';
    pthread_mutex_lock(&c->mu);
    int slot = c->n;
    if (c->n == c->capacity) { /* the least recently used goes; running requests keep theirs */
        slot = 0;
        for (int i = 1; i < c->n; i++)
            if (c->entries[i].used < c->entries[slot].used)
                slot = i;
        gen_grammar_release(c->entries[slot].g);
        structured_spec_free(&c->entries[slot].spec);
    } else {
        c->n++;
    }
    gen_grammar_retain(g);
    c->entries[slot] = (struct cache_entry){.key = key, .spec = copy, .g = g, .used = ++c->tick};
    pthread_mutex_unlock(&c->mu);
    *out = g;
    return 0;
}

void grammar_cache_stats(struct grammar_cache *c, struct grammar_cache_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = (struct grammar_cache_stats){.hits = c->hits, .misses = c->misses, .entries = c->n,
                                        .capacity = c->capacity};
    pthread_mutex_unlock(&c->mu);
}
