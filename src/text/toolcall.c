/* text/toolcall.c — tool calls parsed out of generated text: the markers of each model family, a
 * near-JSON reader with repairs, Qwen3-Coder's XML typed by the tool's schema, and the streaming
 * hold-back that makes any split of the text give the same calls as the whole. */
#include "text/toolcall.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/strbuf.h"
#include "base/utf8.h"

/* Deeper JSON than this in a tool call is refused (the reader recurses). */
#define MAX_DEPTH 64

/* ---- the template decides the syntax ------------------------------------------ */

enum toolcall_syntax toolcall_syntax_for_template(const char *src, const char **why)
{
    const char *w;
    enum toolcall_syntax s;
    if (src && strstr(src, "<tool_call>") && strstr(src, "<function=")) {
        s = TOOLCALL_QWEN3_CODER;
        w = "the chat template writes <tool_call> and <function=";
    } else if (src && strstr(src, "<tool_call>")) {
        s = TOOLCALL_HERMES;
        w = "the chat template writes <tool_call>";
    } else if (src && strstr(src, "[TOOL_CALLS]")) {
        s = TOOLCALL_MISTRAL;
        w = "the chat template writes [TOOL_CALLS]";
    } else if (src && strstr(src, "<|python_tag|>")) {
        s = TOOLCALL_LLAMA_JSON;
        w = "the chat template writes <|python_tag|>";
    } else if (src && strstr(src, "\"parameters\": ") && strstr(src, "\"name\": ")) {
        s = TOOLCALL_LLAMA_JSON;
        w = "the chat template writes Llama 3.1's {\"name\": …, \"parameters\": …} calls";
    } else {
        s = TOOLCALL_HERMES;
        w = "the chat template names no tool-call format; Hermes is the default";
    }
    if (why)
        *why = w;
    return s;
}

const char *toolcall_syntax_name(enum toolcall_syntax s)
{
    switch (s) {
    case TOOLCALL_QWEN3_CODER:
        return "qwen3_coder";
    case TOOLCALL_LLAMA_JSON:
        return "llama_json";
    case TOOLCALL_MISTRAL:
        return "mistral";
    case TOOLCALL_HERMES:
        break;
    }
    return "hermes";
}

/* ---- near-JSON --------------------------------------------------------------- */

struct nj {
    const char *s;
    size_t n, i;
    int depth;
};

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void nj_ws(struct nj *p)
{
    while (p->i < p->n && is_ws(p->s[p->i]))
        p->i++;
}

static bool nj_lit(struct nj *p, const char *word)
{
    size_t len = strlen(word);
    if (p->n - p->i < len || memcmp(p->s + p->i, word, len) != 0)
        return false;
    char next = p->i + len < p->n ? p->s[p->i + len] : ' ';
    if ((next >= 'a' && next <= 'z') || (next >= 'A' && next <= 'Z') ||
        (next >= '0' && next <= '9') || next == '_')
        return false;
    p->i += len;
    return true;
}

static int hex4(const char *s, unsigned *out)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static void put_utf8(struct strbuf *b, unsigned cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    strbuf_append(b, u, n);
}

/* A string quoted with " or ' (the one at p->i). Raw control characters are
 * kept (models write code with real newlines); the result must be UTF-8. */
static int nj_string(struct nj *p, struct strbuf *b)
{
    char quote = p->s[p->i++];
    while (p->i < p->n) {
        char c = p->s[p->i++];
        if (c == quote)
            return b->failed ? -INFERD_ENOMEM
                   : utf8_valid((const unsigned char *)(b->data ? b->data : ""), b->len)
                       ? 0
                       : -INFERD_EFORMAT;
        if (c != '\\') {
            strbuf_putc(b, c);
            continue;
        }
        if (p->i >= p->n)
            break;
        char e = p->s[p->i++];
        unsigned cp, lo;
        switch (e) {
        case '"': case '\\': case '/': case '\'':
            strbuf_putc(b, e);
            break;
        case 'b': strbuf_putc(b, '\b'); break;
        case 'f': strbuf_putc(b, '\f'); break;
        case 'n': strbuf_putc(b, '\n'); break;
        case 'r': strbuf_putc(b, '\r'); break;
        case 't': strbuf_putc(b, '\t'); break;
        case 'u':
            if (p->n - p->i < 4 || hex4(p->s + p->i, &cp) < 0)
                return -INFERD_EFORMAT;
            p->i += 4;
            if (cp >= 0xD800 && cp < 0xDC00) {
                if (p->n - p->i < 6 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u' ||
                    hex4(p->s + p->i + 2, &lo) < 0 || lo < 0xDC00 || lo >= 0xE000)
                    return -INFERD_EFORMAT;
                p->i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp < 0xE000) {
                return -INFERD_EFORMAT;
            }
            put_utf8(b, cp);
            break;
        default:
            return -INFERD_EFORMAT;
        }
    }
    return -INFERD_EFORMAT; /* never closed */
}

/* A JSON number, kept as written (json-c prints a double_s with its text). */
static int nj_number(struct nj *p, json_object **out)
{
    size_t start = p->i;
    bool integral = true;
    if (p->i < p->n && p->s[p->i] == '-')
        p->i++;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
        return -INFERD_EFORMAT;
    if (p->s[p->i] == '0')
        p->i++;
    else
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
    if (p->i < p->n && p->s[p->i] == '.') {
        integral = false;
        p->i++;
        size_t d = p->i;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
        if (p->i == d)
            return -INFERD_EFORMAT;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        integral = false;
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
            p->i++;
        size_t d = p->i;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
        if (p->i == d)
            return -INFERD_EFORMAT;
    }
    size_t len = p->i - start;
    char buf[64];
    char *text = len < sizeof buf ? buf : malloc(len + 1);
    if (!text)
        return -INFERD_ENOMEM;
    memcpy(text, p->s + start, len);
    text[len] = '\0';
    errno = 0;
    long long v = integral ? strtoll(text, NULL, 10) : 0;
    if (integral && errno == 0)
        *out = json_object_new_int64(v);
    else
        *out = json_object_new_double_s(strtod(text, NULL), text);
    if (text != buf)
        free(text);
    return *out ? 0 : -INFERD_ENOMEM;
}

static int nj_value(struct nj *p, json_object **out);

/* A key: a string in either quote, or a bare identifier. */
static int nj_key(struct nj *p, struct strbuf *key)
{
    if (p->i >= p->n)
        return -INFERD_EFORMAT;
    char c = p->s[p->i];
    if (c == '"' || c == '\'')
        return nj_string(p, key);
    size_t start = p->i;
    while (p->i < p->n) {
        c = p->s[p->i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '$' ||
            (p->i > start && ((c >= '0' && c <= '9') || c == '-')))
            p->i++;
        else
            break;
    }
    if (p->i == start)
        return -INFERD_EFORMAT;
    strbuf_append(key, p->s + start, p->i - start);
    return key->failed ? -INFERD_ENOMEM : 0;
}

static int nj_object(struct nj *p, json_object **out)
{
    p->i++; /* { */
    json_object *o = json_object_new_object();
    if (!o)
        return -INFERD_ENOMEM;
    struct strbuf key = {0};
    int rc = 0;
    nj_ws(p);
    while (p->i < p->n && p->s[p->i] != '}') {
        strbuf_reset(&key);
        json_object *v = NULL;
        if ((rc = nj_key(p, &key)) < 0)
            break;
        nj_ws(p);
        if (p->i >= p->n || p->s[p->i] != ':') {
            rc = -INFERD_EFORMAT;
            break;
        }
        p->i++;
        nj_ws(p);
        if ((rc = nj_value(p, &v)) < 0)
            break;
        if (json_object_object_add(o, key.data ? key.data : "", v) != 0) {
            json_object_put(v);
            rc = -INFERD_ENOMEM;
            break;
        }
        nj_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++; /* a trailing comma before } is repaired */
            nj_ws(p);
        } else if (p->i < p->n && p->s[p->i] != '}') {
            rc = -INFERD_EFORMAT;
            break;
        }
    }
    strbuf_free(&key);
    if (rc == 0 && p->i >= p->n)
        rc = -INFERD_EFORMAT;
    if (rc < 0) {
        json_object_put(o);
        return rc;
    }
    p->i++; /* } */
    *out = o;
    return 0;
}

static int nj_array(struct nj *p, json_object **out)
{
    p->i++; /* [ */
    json_object *a = json_object_new_array();
    if (!a)
        return -INFERD_ENOMEM;
    int rc = 0;
    nj_ws(p);
    while (p->i < p->n && p->s[p->i] != ']') {
        json_object *v = NULL;
        if ((rc = nj_value(p, &v)) < 0)
            break;
        if (json_object_array_add(a, v) != 0) {
            json_object_put(v);
            rc = -INFERD_ENOMEM;
            break;
        }
        nj_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            nj_ws(p);
        } else if (p->i < p->n && p->s[p->i] != ']') {
            rc = -INFERD_EFORMAT;
            break;
        }
    }
    if (rc == 0 && p->i >= p->n)
        rc = -INFERD_EFORMAT;
    if (rc < 0) {
        json_object_put(a);
        return rc;
    }
    p->i++; /* ] */
    *out = a;
    return 0;
}

static int nj_value(struct nj *p, json_object **out)
{
    *out = NULL;
    if (p->i >= p->n)
        return -INFERD_EFORMAT;
    char c = p->s[p->i];
    int rc;
    if (c == '{' || c == '[') {
        if (++p->depth > MAX_DEPTH)
            return -INFERD_EFORMAT;
        rc = c == '{' ? nj_object(p, out) : nj_array(p, out);
        p->depth--;
        return rc;
    }
    if (c == '"' || c == '\'') {
        struct strbuf b = {0};
        rc = nj_string(p, &b);
        if (rc == 0) {
            *out = json_object_new_string_len(b.data ? b.data : "", (int)b.len);
            if (!*out)
                rc = -INFERD_ENOMEM;
        }
        strbuf_free(&b);
        return rc;
    }
    if (c == '-' || (c >= '0' && c <= '9'))
        return nj_number(p, out);
    if (nj_lit(p, "true") || nj_lit(p, "True"))
        return (*out = json_object_new_boolean(1)) ? 0 : -INFERD_ENOMEM;
    if (nj_lit(p, "false") || nj_lit(p, "False"))
        return (*out = json_object_new_boolean(0)) ? 0 : -INFERD_ENOMEM;
    if (nj_lit(p, "null") || nj_lit(p, "None"))
        return 0;
    return -INFERD_EFORMAT;
}

/* Drops a Markdown code fence around text: ```json … ``` (or bare ```). */
static void strip_fence(const char **s, size_t *n)
{
    const char *t = *s;
    size_t len = *n;
    while (len > 0 && is_ws(*t)) {
        t++;
        len--;
    }
    while (len > 0 && is_ws(t[len - 1]))
        len--;
    if (len >= 6 && !memcmp(t, "```", 3) && !memcmp(t + len - 3, "```", 3)) {
        size_t i = 3;
        while (i < len - 3 && t[i] != '\n' && t[i] != '{' && t[i] != '[')
            i++; /* the fence's language tag */
        *s = t + i;
        *n = len - 3 - i;
    }
}

int toolcall_json_repair(const char *text, size_t len, json_object **out, struct err *err)
{
    *out = NULL;
    strip_fence(&text, &len);
    struct nj p = {.s = text, .n = len};
    nj_ws(&p);
    int rc = nj_value(&p, out);
    if (rc == 0) {
        nj_ws(&p);
        if (p.i != p.n)
            rc = -INFERD_EFORMAT;
    }
    if (rc < 0) {
        json_object_put(*out);
        *out = NULL;
        if (rc == -INFERD_ENOMEM)
            return err_set(err, INFERD_ENOMEM, "out of memory reading a tool call");
        return err_set(err, INFERD_EFORMAT, "not JSON, even after repairs (near byte %zu)", p.i);
    }
    return 0;
}

/* ---- one call out of its text ----------------------------------------------------- */

struct call {
    char *name; /* owned */
    char *args; /* owned; compact JSON object text */
};

static void calls_free(struct call *c, int n)
{
    for (int i = 0; i < n; i++) {
        free(c[i].name);
        free(c[i].args);
    }
}

/* A function name: non-empty UTF-8 without control characters (NUL included). */
static bool valid_name(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return n > 0 && utf8_valid((const unsigned char *)s, n);
}

static int serialise(json_object *args, char **out)
{
    const char *s = args ? json_object_to_json_string_ext(
                               args, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE)
                         : "{}";
    *out = s ? strdup(s) : NULL;
    return *out ? 0 : -INFERD_ENOMEM;
}

/* {"name": …, "arguments" | "parameters": {…} or its JSON text} (or OpenAI's
 * {"function": {…}} around it) as a call. */
static int call_from_object(json_object *o, struct call *c)
{
    json_object *fn = NULL, *name = NULL, *args = NULL, *parsed = NULL;
    if (!json_object_is_type(o, json_type_object))
        return -INFERD_EFORMAT;
    if (!json_object_object_get_ex(o, "name", NULL) &&
        json_object_object_get_ex(o, "function", &fn) && json_object_is_type(fn, json_type_object))
        o = fn;
    if (!json_object_object_get_ex(o, "name", &name) || !json_object_is_type(name, json_type_string) ||
        !valid_name(json_object_get_string(name), (size_t)json_object_get_string_len(name)))
        return -INFERD_EFORMAT;
    if (!json_object_object_get_ex(o, "arguments", &args))
        json_object_object_get_ex(o, "parameters", &args);
    if (json_object_is_type(args, json_type_string)) {
        struct err e = {0};
        int rc = toolcall_json_repair(json_object_get_string(args),
                                      (size_t)json_object_get_string_len(args), &parsed, &e);
        if (rc < 0)
            return rc;
        args = parsed;
    }
    int rc = 0;
    if (args && !json_object_is_type(args, json_type_object))
        rc = -INFERD_EFORMAT;
    else if ((c->name = strdup(json_object_get_string(name))) == NULL ||
             serialise(args, &c->args) < 0)
        rc = -INFERD_ENOMEM;
    json_object_put(parsed);
    if (rc < 0) {
        free(c->name);
        c->name = NULL;
    }
    return rc;
}

/* One call object, or an array of them (all must be calls), into *calls. */
static int calls_from_json(const char *text, size_t len, struct call **calls, int *n)
{
    json_object *v = NULL;
    struct err e = {0};
    int rc = toolcall_json_repair(text, len, &v, &e);
    if (rc < 0)
        return rc;
    bool list = json_object_is_type(v, json_type_array);
    size_t count = list ? json_object_array_length(v) : 1;
    if (count == 0 || !v) {
        json_object_put(v);
        return -INFERD_EFORMAT;
    }
    *calls = calloc(count, sizeof **calls);
    if (!*calls) {
        json_object_put(v);
        return -INFERD_ENOMEM;
    }
    for (size_t i = 0; i < count && rc == 0; i++) {
        rc = call_from_object(list ? json_object_array_get_idx(v, i) : v, &(*calls)[i]);
        if (rc == 0)
            *n = (int)i + 1;
    }
    json_object_put(v);
    if (rc < 0) {
        calls_free(*calls, *n);
        free(*calls);
        *calls = NULL;
        *n = 0;
    }
    return rc;
}

/* ---- Qwen3-Coder XML ---------------------------------------------------------------- */

static const char *find(const char *s, size_t n, const char *what)
{
    size_t w = strlen(what);
    for (size_t i = 0; i + w <= n; i++)
        if (s[i] == what[0] && !memcmp(s + i, what, w))
            return s + i;
    return NULL;
}

/* The JSON Schema "type" of parameter key of tool name in tools, or NULL. */
static json_object *param_type(json_object *tools, const char *name, const char *key)
{
    size_t n = json_object_is_type(tools, json_type_array) ? json_object_array_length(tools) : 0;
    for (size_t i = 0; i < n; i++) {
        json_object *t = json_object_array_get_idx(tools, i), *fn = NULL, *fname = NULL;
        json_object *params = NULL, *props = NULL, *prop = NULL, *type = NULL;
        if (!json_object_object_get_ex(t, "function", &fn))
            fn = t;
        if (!json_object_object_get_ex(fn, "name", &fname) ||
            strcmp(json_object_get_string(fname), name) != 0)
            continue;
        if (!json_object_object_get_ex(fn, "parameters", &params))
            json_object_object_get_ex(fn, "input_schema", &params);
        if (json_object_object_get_ex(params, "properties", &props) &&
            json_object_object_get_ex(props, key, &prop) &&
            json_object_object_get_ex(prop, "type", &type))
            return type;
        return NULL;
    }
    return NULL;
}

/* value as the JSON type named t, or NULL (the caller keeps the string). */
static json_object *typed_value(const char *t, const char *v, size_t len)
{
    json_object *out = NULL;
    struct err e = {0};
    if (!strcmp(t, "boolean")) {
        if (len == 4 && !strncasecmp(v, "true", 4))
            return json_object_new_boolean(1);
        if (len == 5 && !strncasecmp(v, "false", 5))
            return json_object_new_boolean(0);
        return NULL;
    }
    json_type want;
    if (!strcmp(t, "integer") || !strcmp(t, "number"))
        want = strcmp(t, "integer") ? json_type_double : json_type_int;
    else if (!strcmp(t, "object"))
        want = json_type_object;
    else if (!strcmp(t, "array"))
        want = json_type_array;
    else
        return NULL;
    if (toolcall_json_repair(v, len, &out, &e) < 0 || !out)
        return NULL;
    json_type got = json_object_get_type(out);
    bool number = got == json_type_int || got == json_type_double;
    if (got == want || (want == json_type_double && number) ||
        (want == json_type_int && number)) /* an integer written 3.0 stays as written */
        return out;
    json_object_put(out);
    return NULL;
}

/* value typed by the schema's type (a name or a list of them, the first
 * that reads wins): true with *out set (NULL for null), false when the value
 * stays a string. */
static bool param_value(json_object *type, const char *v, size_t len, json_object **out)
{
    *out = NULL;
    bool list = json_object_is_type(type, json_type_array);
    size_t n = list ? json_object_array_length(type) : json_object_is_type(type, json_type_string);
    for (size_t i = 0; i < n; i++) {
        const char *name = json_object_get_string(list ? json_object_array_get_idx(type, i) : type);
        if (!name)
            continue;
        if (!strcmp(name, "null") && len == 4 && !memcmp(v, "null", 4))
            return true;
        if ((*out = typed_value(name, v, len)) != NULL)
            return true;
    }
    return false;
}

/* <function=NAME><parameter=KEY>VALUE</parameter>…</function> as a call. */
static int call_from_xml(const char *s, size_t n, json_object *tools, struct call *c)
{
    const char *end = s + n;
    const char *f = find(s, n, "<function=");
    if (!f || !find(f, (size_t)(end - f), "</function>")) /* a function never closed is text */
        return -INFERD_EFORMAT;
    const char *name = f + strlen("<function="), *gt = memchr(name, '>', (size_t)(end - name));
    if (!gt)
        return -INFERD_EFORMAT;
    const char *ne = gt;
    while (name < ne && is_ws(*name))
        name++;
    while (ne > name && is_ws(ne[-1]))
        ne--;
    if (memchr(name, '<', (size_t)(ne - name)) || !valid_name(name, (size_t)(ne - name)))
        return -INFERD_EFORMAT;
    c->name = strndup(name, (size_t)(ne - name));
    json_object *args = json_object_new_object();
    int rc = c->name && args ? 0 : -INFERD_ENOMEM;
    const char *at = gt + 1;
    while (rc == 0) {
        const char *p = find(at, (size_t)(end - at), "<parameter=");
        const char *close = find(at, (size_t)(end - at), "</function>");
        if (!p || (close && close < p))
            break;
        const char *key = p + strlen("<parameter="), *kgt = memchr(key, '>', (size_t)(end - key));
        if (!kgt) {
            rc = -INFERD_EFORMAT;
            break;
        }
        const char *ke = kgt;
        while (key < ke && is_ws(*key))
            key++;
        while (ke > key && is_ws(ke[-1]))
            ke--;
        const char *v = kgt + 1, *ve = end, *next;
        /* The value runs to its </parameter>, or the next parameter or the
         * function's end when the model left it open. */
        if ((next = find(v, (size_t)(end - v), "</parameter>")) && next < ve)
            ve = next;
        if ((next = find(v, (size_t)(end - v), "<parameter=")) && next < ve)
            ve = next;
        if ((next = find(v, (size_t)(end - v), "</function>")) && next < ve)
            ve = next;
        at = ve;
        if (ve + strlen("</parameter>") <= end && !memcmp(ve, "</parameter>", strlen("</parameter>")))
            at = ve + strlen("</parameter>");
        if (v < ve && *v == '\n')
            v++;
        if (ve > v && ve[-1] == '\n')
            ve--;
        char *k = strndup(key, (size_t)(ke - key));
        if (!k) {
            rc = -INFERD_ENOMEM;
            break;
        }
        if (ke == key || !utf8_valid((const unsigned char *)k, strlen(k)) ||
            !utf8_valid((const unsigned char *)v, (size_t)(ve - v))) {
            free(k);
            rc = -INFERD_EFORMAT;
            break;
        }
        json_object *val = NULL;
        bool typed = param_value(param_type(tools, c->name, k), v, (size_t)(ve - v), &val);
        if (!typed && !(val = json_object_new_string_len(v, (int)(ve - v))))
            rc = -INFERD_ENOMEM;
        else if (json_object_object_add(args, k, val) != 0) {
            json_object_put(val);
            rc = -INFERD_ENOMEM;
        }
        free(k);
    }
    if (rc == 0)
        rc = serialise(args, &c->args);
    json_object_put(args);
    if (rc < 0) {
        free(c->name);
        c->name = NULL;
    }
    return rc;
}

/* The body of a <tool_call>…</tool_call> (or a bare <function=…>): the XML
 * form when it has <function=, else JSON. */
static int calls_from_tagged(const char *s, size_t n, json_object *tools, struct call **calls,
                             int *count)
{
    if (find(s, n, "<function=")) {
        *calls = calloc(1, sizeof **calls);
        if (!*calls)
            return -INFERD_ENOMEM;
        int rc = call_from_xml(s, n, tools, *calls);
        if (rc < 0) {
            free(*calls);
            *calls = NULL;
            return rc;
        }
        *count = 1;
        return 0;
    }
    json_object *v = NULL;
    struct err e = {0};
    int rc = toolcall_json_repair(s, n, &v, &e);
    if (rc < 0)
        return rc;
    bool object = json_object_is_type(v, json_type_object);
    json_object_put(v);
    if (!object) /* one call per tag */
        return -INFERD_EFORMAT;
    return calls_from_json(s, n, calls, count);
}

/* ---- the streaming parser --------------------------------------------------------------- */

enum mode {
    MODE_TEXT,   /* outside calls */
    MODE_TAGGED, /* inside a call that ends at end_tag */
    MODE_JSON,   /* inside a call that ends where its JSON value closes */
};

struct marker {
    const char *text;
    enum mode mode;
    const char *end_tag;   /* MODE_TAGGED */
    bool body_at_marker;   /* the marker is part of the body (<function=) */
};

static const struct marker HERMES_MARKERS[] = {
    {"<tool_call>", MODE_TAGGED, "</tool_call>", false}, {NULL, 0, NULL, false}};
static const struct marker CODER_MARKERS[] = {
    {"<tool_call>", MODE_TAGGED, "</tool_call>", false},
    {"<function=", MODE_TAGGED, "</function>", true},
    {NULL, 0, NULL, false}};
static const struct marker LLAMA_MARKERS[] = {{"<|python_tag|>", MODE_JSON, NULL, false},
                                              {NULL, 0, NULL, false}};
static const struct marker MISTRAL_MARKERS[] = {{"[TOOL_CALLS]", MODE_JSON, NULL, false},
                                                {NULL, 0, NULL, false}};

/* An event as it is built: text lives in the arena at off (pointers are fixed
 * up once the arena stops growing). */
struct pending_event {
    enum toolcall_event_kind kind;
    int index;
    size_t off, len;
};

struct toolcall_parser {
    enum toolcall_syntax syntax;
    const struct marker *markers;
    json_object *tools;     /* one reference, or NULL */
    struct strbuf in;       /* input not yet decided */
    enum mode mode;
    const struct marker *open; /* the marker of the call being read */
    size_t body;            /* where in `in` the call's body starts */
    size_t scanned;         /* how far in `in` the call's end was looked for */
    int depth;              /* MODE_JSON: open brackets so far */
    char quote;             /* MODE_JSON: inside a string quoted with this */
    bool escape;            /* MODE_JSON: the last byte was a backslash in a string */
    bool started;           /* MODE_JSON: the value's first bracket was seen */
    bool fresh;             /* only whitespace given out since the start or the last call:
                               a bare JSON call (Llama {, Mistral [) may begin here */
    bool after_call;        /* whitespace (Llama: and ';') next is dropped */
    int n_calls;
    /* This push's output. */
    struct strbuf arena;
    struct pending_event *pend; /* owned; n_pend of cap_pend */
    size_t n_pend, cap_pend;
    struct toolcall_event *events; /* owned; n_pend of them once fixed up */
    size_t cap_events;
    bool nomem;
};

int toolcall_parser_create(enum toolcall_syntax syntax, json_object *tools,
                           struct toolcall_parser **out, struct err *err)
{
    struct toolcall_parser *p = calloc(1, sizeof *p);
    if (!p)
        return err_set(err, INFERD_ENOMEM, "out of memory for the tool-call parser");
    p->syntax = syntax;
    p->markers = syntax == TOOLCALL_QWEN3_CODER ? CODER_MARKERS
                 : syntax == TOOLCALL_LLAMA_JSON ? LLAMA_MARKERS
                 : syntax == TOOLCALL_MISTRAL    ? MISTRAL_MARKERS
                                                 : HERMES_MARKERS;
    p->tools = json_object_get(tools);
    p->fresh = true;
    *out = p;
    return 0;
}

void toolcall_parser_free(struct toolcall_parser *p)
{
    if (!p)
        return;
    json_object_put(p->tools);
    strbuf_free(&p->in);
    strbuf_free(&p->arena);
    free(p->pend);
    free(p->events);
    free(p);
}

int toolcall_parser_calls(const struct toolcall_parser *p)
{
    return p->n_calls;
}

static void add_event(struct toolcall_parser *p, enum toolcall_event_kind kind, int index,
                      const char *s, size_t len)
{
    if (kind == TOOLCALL_TEXT && len == 0)
        return;
    size_t off = p->arena.len;
    if (!strbuf_append(&p->arena, s, len) || !strbuf_putc(&p->arena, '\0')) {
        p->nomem = true;
        return;
    }
    struct pending_event *last = p->n_pend ? &p->pend[p->n_pend - 1] : NULL;
    if (kind == TOOLCALL_TEXT && last && last->kind == TOOLCALL_TEXT &&
        last->off + last->len + 1 == off) {
        /* Merge with the text just before: drop its NUL, keep one run. */
        memmove(p->arena.data + off - 1, p->arena.data + off, len + 1);
        p->arena.len--;
        last->len += len;
        return;
    }
    if (p->n_pend == p->cap_pend) {
        size_t cap = p->cap_pend ? p->cap_pend * 2 : 8;
        struct pending_event *grown = realloc(p->pend, cap * sizeof *grown);
        if (!grown) {
            p->nomem = true;
            return;
        }
        p->pend = grown;
        p->cap_pend = cap;
    }
    p->pend[p->n_pend++] = (struct pending_event){kind, index, off, len};
}

static void emit_text(struct toolcall_parser *p, size_t len)
{
    add_event(p, TOOLCALL_TEXT, 0, p->in.data, len);
    for (size_t i = 0; i < len && p->fresh; i++)
        if (!is_ws(p->in.data[i]))
            p->fresh = false;
    strbuf_consume(&p->in, len);
}

static void emit_calls(struct toolcall_parser *p, struct call *calls, int n)
{
    for (int i = 0; i < n; i++) {
        int index = p->n_calls++;
        add_event(p, TOOLCALL_CALL_START, index, calls[i].name, strlen(calls[i].name));
        add_event(p, TOOLCALL_ARGUMENTS, index, calls[i].args, strlen(calls[i].args));
        add_event(p, TOOLCALL_CALL_END, index, "", 0);
    }
}

/* The call that ends at in[end): parsed, it goes out as calls; if it does not
 * parse, its text (whitespace and marker included) goes out as text. */
static int close_call(struct toolcall_parser *p, size_t end)
{
    struct call *calls = NULL;
    int n = 0;
    const char *body = p->in.data + p->body;
    size_t len = end - p->body;
    if (p->open->mode == MODE_TAGGED && !p->open->body_at_marker) {
        const char *close = len >= strlen(p->open->end_tag) &&
                                    !memcmp(body + len - strlen(p->open->end_tag),
                                            p->open->end_tag, strlen(p->open->end_tag))
                                ? body + len - strlen(p->open->end_tag)
                                : body + len;
        len = (size_t)(close - body);
    }
    int rc = p->open->mode == MODE_TAGGED ? calls_from_tagged(body, len, p->tools, &calls, &n)
                                          : calls_from_json(body, len, &calls, &n);
    p->mode = MODE_TEXT;
    if (rc == -INFERD_ENOMEM)
        return rc;
    if (rc < 0) {
        p->after_call = false;
        emit_text(p, end);
        p->fresh = false;
        return 0;
    }
    emit_calls(p, calls, n);
    calls_free(calls, n);
    free(calls);
    strbuf_consume(&p->in, end);
    p->after_call = true;
    p->fresh = true;
    return 0;
}

static void open_call(struct toolcall_parser *p, const struct marker *m, size_t body)
{
    p->mode = m->mode;
    p->open = m;
    p->body = body;
    p->scanned = body;
    p->depth = 0;
    p->quote = 0;
    p->escape = false;
    p->started = false;
}

/* The bare JSON that opens a reply (Llama's {, Mistral's [ once the special
 * token is dropped) reads like a call after its marker. */
static const struct marker BARE_JSON = {"", MODE_JSON, NULL, false};

/* Outside calls: give out what cannot begin a call; open the first call found.
 * Returns true when it opened one (the caller goes on reading it). */
static bool advance_text(struct toolcall_parser *p, bool final)
{
    const char *b = p->in.data;
    size_t n = p->in.len;
    if (n == 0)
        return false;
    if (p->after_call) {
        size_t i = 0;
        while (i < n && (is_ws(b[i]) || (p->syntax == TOOLCALL_LLAMA_JSON && b[i] == ';')))
            i++;
        strbuf_consume(&p->in, i);
        if (i == n)
            return false;
        p->after_call = false;
        b = p->in.data;
        n = p->in.len;
    }
    if (p->fresh && (p->syntax == TOOLCALL_LLAMA_JSON || p->syntax == TOOLCALL_MISTRAL)) {
        size_t j = 0;
        while (j < n && is_ws(b[j]))
            j++;
        if (j == n) {
            if (final)
                emit_text(p, n);
            return false;
        }
        /* A marker (or what may grow into one) goes the marker's way. */
        bool marker = false;
        for (const struct marker *m = p->markers; m->text; m++) {
            size_t ml = strlen(m->text), have = n - j < ml ? n - j : ml;
            if (!memcmp(b + j, m->text, have)) {
                if (have < ml && !final)
                    return false;
                marker = have == ml;
            }
        }
        if (!marker && b[j] == (p->syntax == TOOLCALL_LLAMA_JSON ? '{' : '[')) {
            open_call(p, &BARE_JSON, j);
            return true;
        }
        if (!marker)
            p->fresh = false;
    }
    /* The earliest marker. */
    const struct marker *hit = NULL;
    size_t at = n;
    for (const struct marker *m = p->markers; m->text; m++) {
        const char *f = find(b, at, m->text);
        if (f && (size_t)(f - b) < at) {
            at = (size_t)(f - b);
            hit = m;
        }
    }
    if (hit) {
        size_t w = at;
        while (w > 0 && is_ws(b[w - 1]))
            w--;
        emit_text(p, w);
        open_call(p, hit, at - w + (hit->body_at_marker ? 0 : strlen(hit->text)));
        return true;
    }
    if (final) {
        emit_text(p, n);
        return false;
    }
    /* Hold back the longest tail that may begin a marker, the whitespace
     * before it (it may stand next to a call) and an unfinished character. */
    size_t hold = 0;
    for (const struct marker *m = p->markers; m->text; m++) {
        size_t ml = strlen(m->text);
        for (size_t k = (ml - 1 < n ? ml - 1 : n); k > hold; k--)
            if (!memcmp(b + n - k, m->text, k)) {
                hold = k;
                break;
            }
    }
    size_t w = n - hold;
    while (w > 0 && is_ws(b[w - 1]))
        w--;
    w = utf8_safe_cut((const unsigned char *)b, n, w);
    emit_text(p, w);
    return false;
}

/* Inside a call that ends at a tag; *closed says whether it ended. */
static int advance_tagged(struct toolcall_parser *p, bool final, bool *closed)
{
    const char *tag = p->open->end_tag;
    size_t tl = strlen(tag), n = p->in.len;
    size_t from = p->scanned;
    const char *f = find(p->in.data + from, n - from, tag);
    if (f) {
        *closed = true;
        return close_call(p, (size_t)(f - p->in.data) + tl);
    }
    p->scanned = n >= tl ? (n - tl + 1 > p->body ? n - tl + 1 : p->body) : p->body;
    if (!final)
        return 0;
    /* The reply ended inside the tag: a body that reads whole is still a call. */
    *closed = true;
    return close_call(p, n);
}

/* Inside a call that is one JSON value: scanned for where its brackets balance. */
static int advance_json(struct toolcall_parser *p, bool final, bool *closed)
{
    const char *b = p->in.data;
    size_t n = p->in.len, i = p->scanned;
    if (!p->started) {
        while (i < n && is_ws(b[i]))
            i++;
        if (i < n && b[i] != '{' && b[i] != '[') {
            /* A marker that no JSON follows: it and what came so far are text. */
            *closed = true;
            p->mode = MODE_TEXT;
            emit_text(p, i);
            p->fresh = false;
            return 0;
        }
        if (i < n) {
            p->started = true;
            p->body = i;
        }
    }
    for (; p->started && i < n; i++) {
        char c = b[i];
        if (p->quote) {
            if (p->escape)
                p->escape = false;
            else if (c == '\\')
                p->escape = true;
            else if (c == p->quote)
                p->quote = 0;
        } else if (c == '"' || c == '\'') {
            p->quote = c;
        } else if (c == '{' || c == '[') {
            p->depth++;
        } else if ((c == '}' || c == ']') && --p->depth == 0) {
            *closed = true;
            return close_call(p, i + 1);
        }
    }
    p->scanned = i;
    if (final) {
        /* Never closed: text, not a broken call. */
        *closed = true;
        p->mode = MODE_TEXT;
        emit_text(p, n);
        p->fresh = false;
    }
    return 0;
}

static int run(struct toolcall_parser *p, bool final)
{
    for (;;) {
        bool closed = false;
        int rc = 0;
        if (p->mode == MODE_TEXT) {
            if (!advance_text(p, final))
                break;
            continue;
        }
        rc = p->mode == MODE_TAGGED ? advance_tagged(p, final, &closed)
                                    : advance_json(p, final, &closed);
        if (rc < 0)
            return rc;
        if (!closed)
            break;
    }
    return 0;
}

static void begin(struct toolcall_parser *p)
{
    strbuf_reset(&p->arena);
    p->n_pend = 0;
    p->nomem = false;
}

static int collect(struct toolcall_parser *p, struct toolcall_events *out, struct err *err)
{
    out->events = NULL;
    out->n = 0;
    if (p->nomem || p->in.failed)
        return err_set(err, INFERD_ENOMEM, "out of memory parsing tool calls");
    if (p->n_pend > p->cap_events) {
        struct toolcall_event *grown = realloc(p->events, p->n_pend * sizeof *grown);
        if (!grown)
            return err_set(err, INFERD_ENOMEM, "out of memory parsing tool calls");
        p->events = grown;
        p->cap_events = p->n_pend;
    }
    for (size_t i = 0; i < p->n_pend; i++) {
        const struct pending_event *e = &p->pend[i];
        p->events[i] = (struct toolcall_event){e->kind, e->index, p->arena.data + e->off, e->len};
    }
    out->events = p->events;
    out->n = p->n_pend;
    return 0;
}

int toolcall_parser_push(struct toolcall_parser *p, const char *text, size_t len,
                         struct toolcall_events *out, struct err *err)
{
    begin(p);
    if (len > 0 && !strbuf_append(&p->in, text, len))
        return err_set(err, INFERD_ENOMEM, "out of memory parsing tool calls");
    if (run(p, false) < 0)
        p->nomem = true;
    return collect(p, out, err);
}

int toolcall_parser_finish(struct toolcall_parser *p, struct toolcall_events *out,
                           struct err *err)
{
    begin(p);
    if (run(p, true) < 0)
        p->nomem = true;
    return collect(p, out, err);
}
