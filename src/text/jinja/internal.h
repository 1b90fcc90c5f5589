/* text/jinja/internal.h — types shared by the Jinja lexer, parser, value model, evaluator and filters. */
#ifndef INFERD_TEXT_JINJA_INTERNAL_H
#define INFERD_TEXT_JINJA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/err.h"
#include "base/strbuf.h"
#include "text/jinja/jinja.h"

/* ---- arena: every AST node and every render-time value lives in one ---- */

struct arena_chunk;
struct arena {
    struct arena_chunk *head; /* owned; chunk list */
    size_t used_total;        /* bytes handed out, for the memory cap */
    size_t cap;               /* 0 = unlimited */
    bool over;                /* set once cap was hit; allocations then fail */
};

void *jinja_arena_alloc(struct arena *a, size_t n); /* zeroed; NULL when over cap or OOM */
char *jinja_arena_strndup(struct arena *a, const char *s, size_t n);
void jinja_arena_free(struct arena *a);

/* ---- lexer ---- */

enum tok_kind {
    T_EOF, T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END,
    T_NAME, T_STRING, T_INT, T_FLOAT, T_OP,
};

struct token {
    enum tok_kind kind;
    const char *s; /* arena; text, name, decoded string, or operator spelling */
    size_t n;
    int64_t ival;
    double fval;
    int line, col;
};

struct token_list {
    struct token *v; /* arena */
    size_t n;
};

int jinja_lex(struct arena *a, const char *src, size_t len, struct token_list *out, struct err *err);

/* ---- AST ---- */

enum node_kind {
    /* statements */
    N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SET_BLOCK, N_MACRO, N_CALL_BLOCK, N_FILTER_BLOCK,
    N_BREAK, N_CONTINUE, N_DO, N_BODY,
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER,
    N_TEST, N_UNARY, N_BINARY, N_AND, N_OR, N_NOT, N_COMPARE, N_COND,
};

struct node;
struct value;

struct node_list {
    struct node **v; /* arena */
    size_t n;
};

struct kwarg {
    const char *name;
    struct node *val;
};

struct node {
    enum node_kind kind;
    int line, col;
    const char *name;        /* N_NAME, N_GETATTR attr, N_FILTER/N_TEST name, N_SET target name, N_MACRO name */
    const char *op;          /* N_UNARY/N_BINARY/N_COMPARE operator */
    struct node *a, *b, *c;  /* operands: cond/then/else, object/index, etc. */
    struct node_list items;  /* list/tuple items, call args, dict keys, body, compare operands */
    struct node_list items2; /* dict values, else body, macro defaults */
    struct kwarg *kw;        /* call keyword arguments (arena) */
    size_t n_kw;
    const char **names;      /* for-loop targets / macro params (arena) */
    size_t n_names;
    const char *attr;        /* N_SET namespace attribute */
    bool negate;             /* N_TEST "is not" */
    struct value *cval;      /* N_CONST */
    const char *text;        /* N_TEXT */
    size_t text_len;
};

struct jinja_template {
    struct arena arena; /* owns every node */
    struct node *root;  /* N_BODY */
};

int jinja_parse_tokens(struct arena *a, const struct token_list *toks, struct node **root, struct err *err);

/* ---- values ---- */

enum vkind { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_MACRO, V_BUILTIN };

struct vlist;
struct vdict;
struct render;

struct value;
struct builtin;
typedef int (*builtin_fn)(struct render *r, struct builtin *b, struct value *args, size_t nargs,
                          const char **kwnames, struct value *kwvals, size_t nkw, struct value *out,
                          const struct node *at);

struct builtin {
    const char *name;
    builtin_fn fn;
    struct value *self; /* arena; bound receiver or NULL */
};

struct macro {
    const struct node *def; /* N_MACRO */
    void *closure;          /* struct scope * */
};

struct value {
    enum vkind kind;
    bool is_tuple; /* V_LIST printed as a tuple */
    union {
        bool b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s; /* arena or static; NUL-terminated */
        struct vlist *l;
        struct vdict *d;
        struct macro *m;
        struct builtin *fn;
    } u;
};

struct vlist {
    struct value *v; /* arena */
    size_t n, cap;
};

struct vdict {
    struct value *keys; /* arena */
    struct value *vals;
    size_t n, cap;
};

/* Constructors, inline so they stay private to the interpreter. A string or
 * container whose arena is over its cap comes back V_UNDEF. */
static inline struct value v_undef(void) { return (struct value){.kind = V_UNDEF}; }
static inline struct value v_none(void) { return (struct value){.kind = V_NONE}; }
static inline struct value v_bool(bool b) { return (struct value){.kind = V_BOOL, .u.b = b}; }
static inline struct value v_int(int64_t i) { return (struct value){.kind = V_INT, .u.i = i}; }
static inline struct value v_float(double f) { return (struct value){.kind = V_FLOAT, .u.f = f}; }

/* Copies s into the arena. */
static inline struct value v_str(struct arena *a, const char *s, size_t n)
{
    struct value v = {.kind = V_STR};
    char *p = jinja_arena_strndup(a, s, n);
    if (!p)
        return v_undef();
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}

/* Points at s (static), no copy. */
static inline struct value v_cstr(const char *s)
{
    struct value v = {.kind = V_STR};
    v.u.s.p = s;
    v.u.s.n = strlen(s);
    return v;
}

static inline struct value v_list(struct arena *a)
{
    struct value v = {.kind = V_LIST};
    v.u.l = jinja_arena_alloc(a, sizeof(struct vlist));
    return v.u.l ? v : v_undef();
}

static inline struct value v_dict(struct arena *a)
{
    struct value v = {.kind = V_DICT};
    v.u.d = jinja_arena_alloc(a, sizeof(struct vdict));
    return v.u.d ? v : v_undef();
}

int jinja_list_push(struct arena *a, struct vlist *l, struct value v);
int jinja_dict_set(struct arena *a, struct vdict *d, struct value k, struct value v);
struct value *jinja_dict_get(const struct vdict *d, struct value k);
struct value *jinja_dict_get_str(const struct vdict *d, const char *k);

bool jinja_value_truthy(const struct value *v);
bool jinja_value_equal(const struct value *a, const struct value *b);
/* Python ordering; returns 0 and sets *cmp, or -1 when the types cannot be ordered. */
int jinja_value_compare(const struct value *a, const struct value *b, int *cmp);
const char *jinja_value_type_name(const struct value *v);
size_t jinja_utf8_len(const char *s, size_t n);
/* Byte offset of code point index cp (clamped to n). */
size_t jinja_utf8_offset(const char *s, size_t n, size_t cp);

/* Output goes to base/strbuf (its limit is the output cap); these keep the
 * renderer's 0 / -1 convention for appends. */
static inline int jinja_put(struct strbuf *b, const char *s, size_t n)
{
    return strbuf_append(b, s, n) ? 0 : -1;
}
static inline int jinja_puts(struct strbuf *b, const char *s)
{
    return strbuf_puts(b, s) ? 0 : -1;
}

/* str(v) as Python prints it (None, True, 1.0, ['a']); repr when as_repr. Returns -1 on depth/size overflow. */
int jinja_value_to_str(struct strbuf *b, const struct value *v, bool as_repr, int depth);
/* json.dumps options, as transformers' tojson filter passes them. */
struct json_fmt {
    int indent;           /* < 0: one line */
    const char *item_sep; /* ", " (or "," when indenting) unless separators= */
    const char *key_sep;  /* ": " */
    bool sort_keys;
    bool ensure_ascii;
};
int jinja_value_to_json(struct strbuf *b, const struct value *v, const struct json_fmt *f, struct err *err);
struct value jinja_value_from_json(struct arena *a, struct json_object *j);
/* Value as a string (str()), arena-allocated. */
int jinja_value_stringify(struct render *r, const struct value *v, struct value *out, const struct node *at);

/* ---- renderer ---- */

struct scope {
    struct vdict *vars; /* arena */
    struct scope *parent;
};

struct render {
    struct arena arena;       /* owns every value */
    struct strbuf *out;         /* current output target */
    struct jinja_limits lim;
    long steps;
    int depth;                /* macro/call nesting, against lim.max_depth */
    int native;               /* C recursion of eval/exec, bounded so no template can exhaust the stack */
    struct scope *globals;
    struct err *err;
};

int jinja_error(struct render *r, const struct node *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* filters.c */
int jinja_apply_filter(struct render *r, const char *name, struct value *in, struct value *args, size_t nargs,
                       const char **kwnames, struct value *kwvals, size_t nkw, struct value *out,
                       const struct node *at);
int jinja_apply_test(struct render *r, const char *name, struct value *in, struct value *args, size_t nargs,
                     bool *res, const struct node *at);
/* Attribute lookup: dict keys and the methods of str/dict/list. */
int jinja_getattr(struct render *r, struct value *obj, const char *name, struct value *out, const struct node *at);
bool jinja_has_filter(const char *name);
bool jinja_has_test(const char *name);
int jinja_global_builtin(const char *name, struct value *out);

#endif
