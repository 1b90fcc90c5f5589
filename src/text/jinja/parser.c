/* text/jinja/parser.c — recursive-descent parser from tokens to the AST, with Jinja2's precedence;
 * every node keeps the line and column it came from for error messages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/internal.h"

#define MAX_PARSE_DEPTH 200

struct parser {
    struct arena *a;
    const struct token *t;
    size_t n, i;
    int depth;
    struct err *err;
};

static const struct token *cur(struct parser *p) { return &p->t[p->i < p->n ? p->i : p->n - 1]; }
static const struct token *peek(struct parser *p, size_t k)
{
    size_t j = p->i + k;
    return &p->t[j < p->n ? j : p->n - 1];
}

static int perr(struct parser *p, const struct token *at, const char *fmt, const char *arg)
{
    char m[256];
    snprintf(m, sizeof m, fmt, arg ? arg : "");
    return err_set(p->err, INFERD_EFORMAT, "template line %d, column %d: %s", at->line, at->col, m);
}

static const char *tok_desc(const struct token *t)
{
    switch (t->kind) {
    case T_EOF: return "end of template";
    case T_TEXT: return "text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_NAME: return "a name";
    case T_STRING: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    case T_OP: return t->s;
    }
    return "token";
}

static bool is_op(const struct token *t, const char *op) { return t->kind == T_OP && strcmp(t->s, op) == 0; }
static bool is_name(const struct token *t, const char *nm)
{
    return t->kind == T_NAME && t->n == strlen(nm) && memcmp(t->s, nm, t->n) == 0;
}

static bool accept_op(struct parser *p, const char *op)
{
    if (is_op(cur(p), op)) {
        p->i++;
        return true;
    }
    return false;
}
static bool accept_name(struct parser *p, const char *nm)
{
    if (is_name(cur(p), nm)) {
        p->i++;
        return true;
    }
    return false;
}

static int expect_op(struct parser *p, const char *op)
{
    if (accept_op(p, op))
        return 0;
    char m[96];
    snprintf(m, sizeof m, "expected '%s', got %s", op, tok_desc(cur(p)));
    return perr(p, cur(p), "%s", m);
}

static int expect_kind(struct parser *p, enum tok_kind k, const char *what)
{
    if (cur(p)->kind == k) {
        p->i++;
        return 0;
    }
    char m[128];
    snprintf(m, sizeof m, "expected %s, got %s", what, tok_desc(cur(p)));
    return perr(p, cur(p), "%s", m);
}

static struct node *mk(struct parser *p, enum node_kind k, const struct token *at)
{
    struct node *n = jinja_arena_alloc(p->a, sizeof(*n));
    if (!n) {
        err_set(p->err, INFERD_ENOMEM, "template: out of memory");
        return NULL;
    }
    n->kind = k;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static int nl_push(struct parser *p, struct node_list *l, struct node *x)
{
    /* Grow by doubling inside the arena: capacity is the next power of two >= n. */
    size_t cap = 1;
    while (cap < l->n)
        cap *= 2;
    if (l->n == 0 || l->n == cap) {
        size_t nc = l->n ? cap * 2 : 4;
        struct node **nv = jinja_arena_alloc(p->a, nc * sizeof(*nv));
        if (!nv)
            return err_set(p->err, INFERD_ENOMEM, "template: out of memory");
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof(*nv));
        l->v = nv;
    }
    l->v[l->n++] = x;
    return 0;
}

static const char *tok_name(struct parser *p, const struct token *t) { return jinja_arena_strndup(p->a, t->s, t->n); }

static struct node *parse_expr(struct parser *p);
static struct node *parse_or(struct parser *p);
static struct node *parse_unary(struct parser *p, bool with_filter);
static struct node *parse_primary(struct parser *p);
static struct node *parse_postfix(struct parser *p, struct node *n);

#define ENTER(p)                                                                      \
    do {                                                                              \
        if (++(p)->depth > MAX_PARSE_DEPTH) {                                         \
            perr(p, cur(p), "%s", "template nested too deeply");                      \
            return NULL;                                                              \
        }                                                                             \
    } while (0)
#define LEAVE(p) ((p)->depth--)

static struct node *const_node(struct parser *p, const struct token *at, struct value v)
{
    struct node *n = mk(p, N_CONST, at);
    if (!n)
        return NULL;
    n->cval = jinja_arena_alloc(p->a, sizeof(struct value));
    if (!n->cval)
        return NULL;
    *n->cval = v;
    return n;
}

/* Parses call arguments after '(' up to ')': positional then keyword. */
static int parse_args(struct parser *p, struct node *call)
{
    size_t kwcap = 0;
    while (!is_op(cur(p), ")")) {
        if (call->items.n + call->n_kw > 0 && expect_op(p, ","))
            return -1;
        if (is_op(cur(p), ")"))
            break;
        if (cur(p)->kind == T_NAME && is_op(peek(p, 1), "=")) {
            const char *nm = tok_name(p, cur(p));
            p->i += 2;
            struct node *v = parse_expr(p);
            if (!v || !nm)
                return -1;
            if (call->n_kw == kwcap) {
                size_t nc = kwcap ? kwcap * 2 : 4;
                struct kwarg *nk = jinja_arena_alloc(p->a, nc * sizeof(*nk));
                if (!nk)
                    return err_set(p->err, INFERD_ENOMEM, "template: out of memory");
                if (call->n_kw)
                    memcpy(nk, call->kw, call->n_kw * sizeof(*nk));
                call->kw = nk;
                kwcap = nc;
            }
            call->kw[call->n_kw].name = nm;
            call->kw[call->n_kw].val = v;
            call->n_kw++;
        } else {
            if (call->n_kw)
                return perr(p, cur(p), "%s", "positional argument after keyword argument");
            struct node *v = parse_expr(p);
            if (!v || nl_push(p, &call->items, v))
                return -1;
        }
    }
    return expect_op(p, ")");
}

static struct node *parse_filter(struct parser *p, struct node *in)
{
    const struct token *at = cur(p);
    if (cur(p)->kind != T_NAME) {
        perr(p, cur(p), "%s", "expected a filter name after '|'");
        return NULL;
    }
    struct node *f = mk(p, N_FILTER, at);
    if (!f)
        return NULL;
    f->name = tok_name(p, cur(p));
    if (f->name && !jinja_has_filter(f->name)) {
        perr(p, cur(p), "no filter named '%s'", f->name);
        return NULL;
    }
    p->i++;
    f->a = in;
    if (accept_op(p, "(") && parse_args(p, f))
        return NULL;
    return f;
}

static struct node *parse_test(struct parser *p, struct node *in)
{
    const struct token *at = cur(p);
    struct node *t = mk(p, N_TEST, at);
    if (!t)
        return NULL;
    t->a = in;
    if (accept_name(p, "not"))
        t->negate = true;
    const struct token *nt = cur(p);
    if (nt->kind != T_NAME) {
        perr(p, nt, "%s", "expected a test name after 'is'");
        return NULL;
    }
    t->name = tok_name(p, nt);
    if (t->name && !jinja_has_test(t->name)) {
        perr(p, nt, "no test named '%s'", t->name);
        return NULL;
    }
    p->i++;
    if (accept_op(p, "(")) {
        if (parse_args(p, t))
            return NULL;
    } else {
        const struct token *c = cur(p);
        bool arg = c->kind == T_STRING || c->kind == T_INT || c->kind == T_FLOAT || is_op(c, "[") ||
                   is_op(c, "{") ||
                   (c->kind == T_NAME && !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and") &&
                    !is_name(c, "if") && !is_name(c, "is") && !is_name(c, "not") && !is_name(c, "in"));
        if (arg) {
            struct node *x = parse_primary(p);
            if (!x)
                return NULL;
            x = parse_postfix(p, x);
            if (!x || nl_push(p, &t->items, x))
                return NULL;
        }
    }
    return t;
}

static struct node *parse_call(struct parser *p, struct node *fn)
{
    struct node *c = mk(p, N_CALL, cur(p));
    if (!c)
        return NULL;
    p->i++; /* ( */
    c->a = fn;
    if (parse_args(p, c))
        return NULL;
    return c;
}

static struct node *parse_subscript(struct parser *p, struct node *obj)
{
    const struct token *at = cur(p);
    if (accept_op(p, ".")) {
        const struct token *t = cur(p);
        if (t->kind == T_NAME) {
            struct node *g = mk(p, N_GETATTR, t);
            if (!g)
                return NULL;
            g->a = obj;
            g->name = tok_name(p, t);
            p->i++;
            return g;
        }
        if (t->kind == T_INT) {
            struct node *g = mk(p, N_GETITEM, t);
            struct node *k = const_node(p, t, v_int(t->ival));
            if (!g || !k)
                return NULL;
            g->a = obj;
            g->b = k;
            p->i++;
            return g;
        }
        perr(p, t, "%s", "expected an attribute name after '.'");
        return NULL;
    }
    p->i++; /* [ */
    struct node *parts[3] = {NULL, NULL, NULL};
    int np = 0;
    bool is_slice = false;
    for (;;) {
        if (is_op(cur(p), ":")) {
            is_slice = true;
            p->i++;
            if (++np > 2) {
                perr(p, cur(p), "%s", "too many ':' in slice");
                return NULL;
            }
            continue;
        }
        if (is_op(cur(p), "]"))
            break;
        if (parts[np]) {
            perr(p, cur(p), "%s", "expected ']'");
            return NULL;
        }
        parts[np] = parse_expr(p);
        if (!parts[np])
            return NULL;
    }
    p->i++; /* ] */
    struct node *g = mk(p, is_slice ? N_SLICE : N_GETITEM, at);
    if (!g)
        return NULL;
    g->a = obj;
    if (is_slice) {
        g->b = parts[0];
        g->c = parts[1];
        if (parts[2] && nl_push(p, &g->items, parts[2]))
            return NULL;
    } else {
        if (!parts[0]) {
            perr(p, at, "%s", "empty subscript");
            return NULL;
        }
        g->b = parts[0];
    }
    return g;
}

static struct node *parse_postfix(struct parser *p, struct node *n)
{
    while (n) {
        const struct token *t = cur(p);
        if (is_op(t, ".") || is_op(t, "["))
            n = parse_subscript(p, n);
        else if (is_op(t, "("))
            n = parse_call(p, n);
        else
            break;
    }
    return n;
}

static struct node *parse_filter_expr(struct parser *p, struct node *n)
{
    while (n) {
        const struct token *t = cur(p);
        if (is_op(t, "|")) {
            p->i++;
            n = parse_filter(p, n);
        } else if (is_name(t, "is")) {
            p->i++;
            n = parse_test(p, n);
        } else if (is_op(t, "(")) {
            n = parse_call(p, n);
        } else {
            break;
        }
    }
    return n;
}

/* Parses "(a, b)" / "[a, b]" / "{k: v}" after the opener has been seen. */
static struct node *parse_seq(struct parser *p, const struct token *at, const char *close, enum node_kind kind)
{
    struct node *n = mk(p, kind, at);
    if (!n)
        return NULL;
    bool comma = false;
    while (!is_op(cur(p), close)) {
        if (n->items.n && expect_op(p, ","))
            return NULL;
        if (is_op(cur(p), close)) {
            comma = true;
            break;
        }
        struct node *x = parse_expr(p);
        if (!x || nl_push(p, &n->items, x))
            return NULL;
        if (kind == N_DICT) {
            if (expect_op(p, ":"))
                return NULL;
            struct node *v = parse_expr(p);
            if (!v || nl_push(p, &n->items2, v))
                return NULL;
        }
        if (is_op(cur(p), ","))
            comma = true;
    }
    p->i++;
    if (kind == N_TUPLE && n->items.n == 1 && !comma)
        return n->items.v[0]; /* plain parentheses */
    return n;
}

static struct node *parse_primary(struct parser *p)
{
    const struct token *t = cur(p);
    switch (t->kind) {
    case T_NAME:
        p->i++;
        if (is_name(t, "true") || is_name(t, "True"))
            return const_node(p, t, v_bool(true));
        if (is_name(t, "false") || is_name(t, "False"))
            return const_node(p, t, v_bool(false));
        if (is_name(t, "none") || is_name(t, "None"))
            return const_node(p, t, v_none());
        {
            struct node *n = mk(p, N_NAME, t);
            if (n)
                n->name = tok_name(p, t);
            return n;
        }
    case T_STRING: {
        /* adjacent literals concatenate */
        size_t total = 0, j = p->i;
        while (p->t[j].kind == T_STRING)
            total += p->t[j++].n;
        char *s = jinja_arena_alloc(p->a, total + 1);
        if (!s)
            return NULL;
        size_t k = 0;
        while (cur(p)->kind == T_STRING) {
            memcpy(s + k, cur(p)->s, cur(p)->n);
            k += cur(p)->n;
            p->i++;
        }
        struct value v = {.kind = V_STR};
        v.u.s.p = s;
        v.u.s.n = k;
        return const_node(p, t, v);
    }
    case T_INT:
        p->i++;
        return const_node(p, t, v_int(t->ival));
    case T_FLOAT:
        p->i++;
        return const_node(p, t, v_float(t->fval));
    case T_OP:
        if (is_op(t, "(")) {
            p->i++;
            return parse_seq(p, t, ")", N_TUPLE);
        }
        if (is_op(t, "[")) {
            p->i++;
            return parse_seq(p, t, "]", N_LIST);
        }
        if (is_op(t, "{")) {
            p->i++;
            return parse_seq(p, t, "}", N_DICT);
        }
        break;
    default:
        break;
    }
    char m[96];
    snprintf(m, sizeof m, "unexpected %s", tok_desc(t));
    perr(p, t, "%s", m);
    return NULL;
}

static struct node *binary(struct parser *p, enum node_kind k, const char *op, struct node *l, struct node *r,
                           const struct token *at)
{
    if (!l || !r)
        return NULL;
    struct node *n = mk(p, k, at);
    if (!n)
        return NULL;
    n->op = op;
    n->a = l;
    n->b = r;
    return n;
}

static struct node *parse_unary(struct parser *p, bool with_filter)
{
    ENTER(p);
    const struct token *t = cur(p);
    struct node *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        p->i++;
        struct node *x = parse_unary(p, false);
        if (!x)
            return NULL;
        n = mk(p, N_UNARY, t);
        if (!n)
            return NULL;
        n->op = t->s;
        n->a = x;
    } else {
        n = parse_primary(p);
        n = parse_postfix(p, n);
    }
    if (with_filter)
        n = parse_filter_expr(p, n);
    LEAVE(p);
    return n;
}

/* One level of left-associative binary operators: operands come from next,
 * operators are any of ops, as symbol tokens or (word) as keywords. */
struct binary_level {
    enum node_kind kind;
    bool word;
    const char *ops[5]; /* NULL-terminated */
};

static struct node *parse_left_assoc(struct parser *p, const struct binary_level *lv,
                                     struct node *(*next)(struct parser *))
{
    struct node *l = next(p);
    while (l) {
        const struct token *t = cur(p);
        const char *op = NULL;
        for (int i = 0; lv->ops[i] && !op; i++)
            if (lv->word ? is_name(t, lv->ops[i]) : is_op(t, lv->ops[i]))
                op = lv->ops[i];
        if (!op)
            break;
        p->i++;
        l = binary(p, lv->kind, op, l, next(p), t);
    }
    return l;
}

static struct node *parse_filtered_unary(struct parser *p)
{
    return parse_unary(p, true);
}

static struct node *parse_pow(struct parser *p)
{
    static const struct binary_level level = {N_BINARY, false, {"**", NULL}};
    return parse_left_assoc(p, &level, parse_filtered_unary);
}

static struct node *parse_math2(struct parser *p)
{
    static const struct binary_level level = {N_BINARY, false, {"*", "/", "//", "%", NULL}};
    return parse_left_assoc(p, &level, parse_pow);
}

static struct node *parse_concat(struct parser *p)
{
    static const struct binary_level level = {N_BINARY, false, {"~", NULL}};
    return parse_left_assoc(p, &level, parse_math2);
}

static struct node *parse_math1(struct parser *p)
{
    static const struct binary_level level = {N_BINARY, false, {"+", "-", NULL}};
    return parse_left_assoc(p, &level, parse_concat);
}

static struct node *parse_compare(struct parser *p)
{
    struct node *l = parse_math1(p);
    struct node *result = l, *prev = l;
    bool chained = false;
    while (l) {
        const struct token *t = cur(p);
        const char *op = NULL;
        static const char *const cmp_ops[] = {"==", "!=", "<", "<=", ">", ">=", NULL};
        for (int k = 0; cmp_ops[k]; k++)
            if (is_op(t, cmp_ops[k]))
                op = cmp_ops[k];
        if (op) {
            p->i++;
        } else if (is_name(t, "in")) {
            p->i++;
            op = "in";
        } else if (is_name(t, "not") && is_name(peek(p, 1), "in")) {
            p->i += 2;
            op = "not in";
        } else {
            break;
        }
        struct node *r = parse_math1(p);
        struct node *c = binary(p, N_COMPARE, op, prev, r, t);
        if (!c)
            return NULL;
        result = chained ? binary(p, N_AND, "and", result, c, t) : c;
        chained = true;
        prev = r;
    }
    return l ? result : NULL;
}

static struct node *parse_not(struct parser *p)
{
    ENTER(p);
    const struct token *t = cur(p);
    struct node *n;
    if (accept_name(p, "not")) {
        struct node *x = parse_not(p);
        if (!x)
            return NULL;
        n = mk(p, N_NOT, t);
        if (n)
            n->a = x;
    } else {
        n = parse_compare(p);
    }
    LEAVE(p);
    return n;
}

static struct node *parse_and(struct parser *p)
{
    static const struct binary_level level = {N_AND, true, {"and", NULL}};
    return parse_left_assoc(p, &level, parse_not);
}

static struct node *parse_or(struct parser *p)
{
    static const struct binary_level level = {N_OR, true, {"or", NULL}};
    return parse_left_assoc(p, &level, parse_and);
}

static struct node *parse_expr(struct parser *p)
{
    ENTER(p);
    struct node *e = parse_or(p);
    while (e && is_name(cur(p), "if")) {
        const struct token *t = cur(p);
        p->i++;
        struct node *cond = parse_or(p);
        if (!cond)
            return NULL;
        struct node *other = NULL;
        if (accept_name(p, "else")) {
            other = parse_expr(p);
            if (!other)
                return NULL;
        }
        struct node *c = mk(p, N_COND, t);
        if (!c)
            return NULL;
        c->a = cond;
        c->b = e;
        c->c = other;
        e = c;
    }
    LEAVE(p);
    return e;
}

/* An expression that may be an unparenthesised tuple ("a, b"); no ternary when !condexpr. */
static struct node *parse_tuple(struct parser *p, bool condexpr)
{
    const struct token *at = cur(p);
    struct node *first = condexpr ? parse_expr(p) : parse_or(p);
    if (!first || !is_op(cur(p), ","))
        return first;
    struct node *t = mk(p, N_TUPLE, at);
    if (!t || nl_push(p, &t->items, first))
        return NULL;
    while (accept_op(p, ",")) {
        if (cur(p)->kind == T_BLOCK_END || cur(p)->kind == T_VAR_END || is_name(cur(p), "if"))
            break;
        struct node *x = condexpr ? parse_expr(p) : parse_or(p);
        if (!x || nl_push(p, &t->items, x))
            return NULL;
    }
    return t;
}

/* ---- statements ---- */

static int parse_body(struct parser *p, const char *const *ends, const char **which, const struct token *opener,
                      struct node_list *body);

static int end_block(struct parser *p) { return expect_kind(p, T_BLOCK_END, "'%}'"); }

static int parse_name_list(struct parser *p, struct node *n)
{
    bool paren = accept_op(p, "(");
    size_t cap = 0;
    do {
        if (cur(p)->kind != T_NAME)
            return perr(p, cur(p), "%s", "expected a variable name");
        if (n->n_names == cap) {
            size_t nc = cap ? cap * 2 : 4;
            const char **nv = jinja_arena_alloc(p->a, nc * sizeof(*nv));
            if (!nv)
                return err_set(p->err, INFERD_ENOMEM, "template: out of memory");
            if (n->n_names)
                memcpy(nv, n->names, n->n_names * sizeof(*nv));
            n->names = nv;
            cap = nc;
        }
        n->names[n->n_names++] = tok_name(p, cur(p));
        p->i++;
    } while (accept_op(p, ","));
    if (paren && expect_op(p, ")"))
        return -1;
    return 0;
}

static struct node *parse_if(struct parser *p, const struct token *opener)
{
    struct node *n = mk(p, N_IF, opener);
    if (!n)
        return NULL;
    n->a = parse_tuple(p, true);
    if (!n->a || end_block(p))
        return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *which;
    if (parse_body(p, ends, &which, opener, &n->items))
        return NULL;
    if (strcmp(which, "elif") == 0) {
        struct node *e = parse_if(p, &p->t[p->i - 1]);
        if (!e || nl_push(p, &n->items2, e))
            return NULL;
        return n;
    }
    if (strcmp(which, "else") == 0) {
        if (end_block(p))
            return NULL;
        static const char *const ends2[] = {"endif", NULL};
        if (parse_body(p, ends2, &which, opener, &n->items2))
            return NULL;
    }
    if (end_block(p))
        return NULL;
    return n;
}

static struct node *parse_for(struct parser *p, const struct token *opener)
{
    struct node *n = mk(p, N_FOR, opener);
    if (!n || parse_name_list(p, n))
        return NULL;
    if (!accept_name(p, "in")) {
        perr(p, cur(p), "%s", "expected 'in' in for loop");
        return NULL;
    }
    n->a = parse_tuple(p, false);
    if (!n->a)
        return NULL;
    if (accept_name(p, "if")) {
        n->b = parse_expr(p);
        if (!n->b)
            return NULL;
    }
    if (is_name(cur(p), "recursive")) {
        perr(p, cur(p), "%s", "recursive loops are not supported");
        return NULL;
    }
    if (end_block(p))
        return NULL;
    static const char *const ends[] = {"else", "endfor", NULL};
    const char *which;
    if (parse_body(p, ends, &which, opener, &n->items))
        return NULL;
    if (strcmp(which, "else") == 0) {
        if (end_block(p))
            return NULL;
        static const char *const ends2[] = {"endfor", NULL};
        if (parse_body(p, ends2, &which, opener, &n->items2))
            return NULL;
    }
    if (end_block(p))
        return NULL;
    return n;
}

static struct node *parse_set(struct parser *p, const struct token *opener)
{
    struct node *n = mk(p, N_SET, opener);
    if (!n)
        return NULL;
    if (cur(p)->kind == T_NAME && is_op(peek(p, 1), ".")) {
        n->name = tok_name(p, cur(p));
        p->i += 2;
        if (cur(p)->kind != T_NAME) {
            perr(p, cur(p), "%s", "expected an attribute name");
            return NULL;
        }
        n->attr = tok_name(p, cur(p));
        p->i++;
        n->names = jinja_arena_alloc(p->a, sizeof(char *));
        if (!n->names)
            return NULL;
        n->names[0] = n->name;
        n->n_names = 1;
    } else if (parse_name_list(p, n)) {
        return NULL;
    }
    if (accept_op(p, "=")) {
        n->a = parse_tuple(p, true);
        if (!n->a || end_block(p))
            return NULL;
        return n;
    }
    if (n->attr || n->n_names != 1) {
        perr(p, cur(p), "%s", "block set takes one plain variable name");
        return NULL;
    }
    n->kind = N_SET_BLOCK;
    /* optional filters on the block: {% set x | trim %} */
    struct node *chain = NULL;
    while (accept_op(p, "|")) {
        chain = parse_filter(p, chain);
        if (!chain)
            return NULL;
    }
    n->b = chain;
    if (end_block(p))
        return NULL;
    static const char *const ends[] = {"endset", NULL};
    const char *which;
    if (parse_body(p, ends, &which, opener, &n->items) || end_block(p))
        return NULL;
    return n;
}

/* Macro or call-block parameters: "(a, b=1)". */
static int parse_params(struct parser *p, struct node *n)
{
    if (expect_op(p, "("))
        return -1;
    size_t cap = 0;
    while (!is_op(cur(p), ")")) {
        if (n->n_names && expect_op(p, ","))
            return -1;
        if (cur(p)->kind != T_NAME)
            return perr(p, cur(p), "%s", "expected a parameter name");
        if (n->n_names == cap) {
            size_t nc = cap ? cap * 2 : 4;
            const char **nv = jinja_arena_alloc(p->a, nc * sizeof(*nv));
            if (!nv)
                return err_set(p->err, INFERD_ENOMEM, "template: out of memory");
            if (n->n_names)
                memcpy(nv, n->names, n->n_names * sizeof(*nv));
            n->names = nv;
            cap = nc;
        }
        n->names[n->n_names++] = tok_name(p, cur(p));
        p->i++;
        struct node *def = NULL;
        if (accept_op(p, "=")) {
            def = parse_expr(p);
            if (!def)
                return -1;
        } else if (n->items2.n && n->items2.v[n->items2.n - 1]) {
            return perr(p, cur(p), "%s", "parameter without a default after one with a default");
        }
        if (nl_push(p, &n->items2, def))
            return -1;
    }
    p->i++;
    return 0;
}

static struct node *parse_macro(struct parser *p, const struct token *opener)
{
    struct node *n = mk(p, N_MACRO, opener);
    if (!n)
        return NULL;
    if (cur(p)->kind != T_NAME) {
        perr(p, cur(p), "%s", "expected a macro name");
        return NULL;
    }
    n->name = tok_name(p, cur(p));
    p->i++;
    if (parse_params(p, n) || end_block(p))
        return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    const char *which;
    if (parse_body(p, ends, &which, opener, &n->items))
        return NULL;
    if (cur(p)->kind == T_NAME)
        p->i++; /* {% endmacro name %} */
    if (end_block(p))
        return NULL;
    return n;
}

static struct node *parse_call_block(struct parser *p, const struct token *opener)
{
    /* The caller body is an anonymous macro; n->a is the call expression. */
    struct node *n = mk(p, N_CALL_BLOCK, opener);
    if (!n)
        return NULL;
    n->name = "caller";
    if (is_op(cur(p), "(") && parse_params(p, n))
        return NULL;
    n->a = parse_expr(p);
    if (!n->a)
        return NULL;
    if (n->a->kind != N_CALL) {
        perr(p, opener, "%s", "call block needs a macro call");
        return NULL;
    }
    if (end_block(p))
        return NULL;
    static const char *const ends[] = {"endcall", NULL};
    const char *which;
    if (parse_body(p, ends, &which, opener, &n->items) || end_block(p))
        return NULL;
    return n;
}

static struct node *parse_filter_block(struct parser *p, const struct token *opener)
{
    struct node *n = mk(p, N_FILTER_BLOCK, opener);
    if (!n)
        return NULL;
    struct node *chain = parse_filter(p, NULL);
    while (chain && accept_op(p, "|"))
        chain = parse_filter(p, chain);
    if (!chain || end_block(p))
        return NULL;
    n->a = chain;
    static const char *const ends[] = {"endfilter", NULL};
    const char *which;
    if (parse_body(p, ends, &which, opener, &n->items) || end_block(p))
        return NULL;
    return n;
}

static struct node *parse_statement(struct parser *p)
{
    const struct token *opener = cur(p);
    const struct token *t = cur(p);
    if (t->kind != T_NAME) {
        perr(p, t, "%s", "expected a tag name");
        return NULL;
    }
    p->i++;
    if (is_name(t, "if"))
        return parse_if(p, t);
    if (is_name(t, "for"))
        return parse_for(p, t);
    if (is_name(t, "set"))
        return parse_set(p, t);
    if (is_name(t, "macro"))
        return parse_macro(p, t);
    if (is_name(t, "call"))
        return parse_call_block(p, t);
    if (is_name(t, "filter"))
        return parse_filter_block(p, t);
    if (is_name(t, "break") || is_name(t, "continue")) {
        struct node *n = mk(p, is_name(t, "break") ? N_BREAK : N_CONTINUE, t);
        if (!n || end_block(p))
            return NULL;
        return n;
    }
    if (is_name(t, "do")) {
        struct node *n = mk(p, N_DO, t);
        if (!n)
            return NULL;
        n->a = parse_tuple(p, true);
        if (!n->a || end_block(p))
            return NULL;
        return n;
    }
    if (is_name(t, "generation")) {
        /* transformers' AssistantTracker extension: renders its body unchanged */
        struct node *n = mk(p, N_BODY, t);
        static const char *const ends[] = {"endgeneration", NULL};
        const char *which;
        if (!n || end_block(p) || parse_body(p, ends, &which, opener, &n->items) || end_block(p))
            return NULL;
        return n;
    }
    char nm[64];
    snprintf(nm, sizeof nm, "%.*s", (int)(t->n < 60 ? t->n : 60), t->s);
    perr(p, t, "unknown tag '%s'", nm);
    return NULL;
}

static int parse_body(struct parser *p, const char *const *ends, const char **which, const struct token *opener,
                      struct node_list *body)
{
    if (++p->depth > MAX_PARSE_DEPTH)
        return perr(p, cur(p), "%s", "template nested too deeply");
    for (;;) {
        const struct token *t = cur(p);
        if (t->kind == T_EOF) {
            if (!ends) {
                p->depth--;
                return 0;
            }
            size_t last = 0;
            while (ends[last + 1])
                last++;
            char m[160];
            snprintf(m, sizeof m, "missing '%s' for the tag opened here (reached end of template)", ends[last]);
            /* point at where it was opened: what the user has to fix */
            return err_set(p->err, INFERD_EFORMAT, "template line %d, column %d: %s", opener->line, opener->col, m);
        }
        if (t->kind == T_TEXT) {
            struct node *n = mk(p, N_TEXT, t);
            if (!n)
                return -1;
            n->text = t->s;
            n->text_len = t->n;
            p->i++;
            if (nl_push(p, body, n))
                return -1;
        } else if (t->kind == T_VAR_BEGIN) {
            p->i++;
            struct node *n = mk(p, N_OUTPUT, t);
            if (!n)
                return -1;
            n->a = parse_tuple(p, true);
            if (!n->a || expect_kind(p, T_VAR_END, "'}}'") || nl_push(p, body, n))
                return -1;
        } else if (t->kind == T_BLOCK_BEGIN) {
            const struct token *nt = peek(p, 1);
            if (nt->kind == T_NAME && ends) {
                for (int k = 0; ends[k]; k++)
                    if (is_name(nt, ends[k])) {
                        p->i += 2;
                        *which = ends[k];
                        p->depth--;
                        return 0;
                    }
            }
            if (nt->kind == T_NAME && (is_name(nt, "endif") || is_name(nt, "endfor") || is_name(nt, "else") ||
                                       is_name(nt, "elif") || is_name(nt, "endmacro") || is_name(nt, "endset") ||
                                       is_name(nt, "endcall") || is_name(nt, "endfilter") ||
                                       is_name(nt, "endgeneration"))) {
                char nm[32];
                snprintf(nm, sizeof nm, "%.*s", (int)nt->n, nt->s);
                return perr(p, nt, "unexpected '%s'", nm);
            }
            p->i++;
            struct node *n = parse_statement(p);
            if (!n || nl_push(p, body, n))
                return -1;
        } else {
            return perr(p, t, "unexpected %s", tok_desc(t));
        }
    }
}

int jinja_parse_tokens(struct arena *a, const struct token_list *toks, struct node **root, struct err *err)
{
    struct parser p = {.a = a, .t = toks->v, .n = toks->n, .err = err};
    struct node *r = jinja_arena_alloc(a, sizeof(*r));
    if (!r)
        return err_set(err, INFERD_ENOMEM, "template: out of memory");
    r->kind = N_BODY;
    r->line = r->col = 1;
    if (parse_body(&p, NULL, NULL, NULL, &r->items))
        return err && err->code ? -err->code : -INFERD_EFORMAT;
    *root = r;
    return 0;
}

int jinja_parse(const char *src, size_t len, struct jinja_template **out, struct err *err)
{
    *out = NULL;
    struct jinja_template *t = calloc(1, sizeof(*t));
    if (!t)
        return err_set(err, INFERD_ENOMEM, "template: out of memory");
    t->arena.cap = 64u << 20;
    /* The AST points into this copy, not the caller's buffer. Like Jinja, turn \r\n and \r into \n
     * first, then drop one newline at the end of the source (keep_trailing_newline=False). */
    char *copy = jinja_arena_alloc(&t->arena, len + 1);
    if (!copy) {
        jinja_free(t);
        return err_set(err, INFERD_ENOMEM, "template: too large to parse");
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            copy[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            copy[n++] = src[i];
        }
    }
    if (n && copy[n - 1] == '\n')
        n--;
    copy[n] = 0;
    struct token_list toks;
    int rc = jinja_lex(&t->arena, copy, n, &toks, err);
    if (rc == 0)
        rc = jinja_parse_tokens(&t->arena, &toks, &t->root, err);
    if (rc) {
        if (t->arena.over && err)
            err_set(err, INFERD_ENOMEM, "template: too large to parse");
        jinja_free(t);
        return rc < 0 ? rc : -INFERD_EFORMAT;
    }
    *out = t;
    return 0;
}

void jinja_free(struct jinja_template *t)
{
    if (!t)
        return;
    jinja_arena_free(&t->arena);
    free(t);
}
