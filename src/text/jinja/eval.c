/* text/jinja/eval.c — walks the AST: statements write to the output buffer, expressions produce values;
 * enforces the step, depth and output limits. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/internal.h"

enum { ST_OK = 0, ST_BREAK = 1, ST_CONTINUE = 2 };

int jinja_error(struct render *r, const struct node *at, const char *fmt, ...)
{
    if (r->err && r->err->code)
        return -r->err->code; /* keep the first, innermost message */
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (at)
        return err_set(r->err, INFERD_EINVAL, "template line %d, column %d: %s", at->line, at->col, m);
    return err_set(r->err, INFERD_EINVAL, "template: %s", m);
}

static int oom(struct render *r, const struct node *at)
{
    if (r->err && r->err->code)
        return -r->err->code;
    if (r->arena.over)
        return err_set(r->err, INFERD_ERANGE, "template line %d: render used too much memory", at ? at->line : 0);
    return err_set(r->err, INFERD_ERANGE, "template line %d: output exceeds the limit of %zu bytes",
                   at ? at->line : 0, r->lim.max_output_bytes);
}

static int step(struct render *r, const struct node *at)
{
    if (++r->steps > r->lim.max_steps) {
        if (r->err && r->err->code)
            return -r->err->code;
        return err_set(r->err, INFERD_ERANGE, "template line %d: exceeded the step limit (%ld steps)",
                       at ? at->line : 0, r->lim.max_steps);
    }
    return 0;
}

/* ---- scopes ---- */

static struct scope *scope_new(struct render *r, struct scope *parent)
{
    struct scope *s = jinja_arena_alloc(&r->arena, sizeof(*s));
    if (!s)
        return NULL;
    s->vars = jinja_arena_alloc(&r->arena, sizeof(struct vdict));
    if (!s->vars)
        return NULL;
    s->parent = parent;
    return s;
}

static struct value *scope_lookup(struct scope *s, const char *name)
{
    for (; s; s = s->parent) {
        struct value *v = jinja_dict_get_str(s->vars, name);
        if (v)
            return v;
    }
    return NULL;
}

static int scope_set(struct render *r, struct scope *s, const char *name, struct value v, const struct node *at)
{
    if (jinja_dict_set(&r->arena, s->vars, v_cstr(name), v))
        return oom(r, at);
    return 0;
}

/* ---- expressions ---- */

static int eval(struct render *r, struct scope *s, const struct node *n, struct value *out);
static int exec_body(struct render *r, struct scope *s, const struct node_list *body);

static int render_body_to_string(struct render *r, struct scope *s, const struct node_list *body, struct value *out,
                                 const struct node *at)
{
    struct strbuf buf = {.limit = r->lim.max_output_bytes};
    struct strbuf *saved = r->out;
    r->out = &buf;
    int rc = exec_body(r, s, body);
    r->out = saved;
    if (rc < 0) {
        strbuf_free(&buf);
        return rc;
    }
    *out = v_str(&r->arena, buf.data ? buf.data : "", buf.len);
    strbuf_free(&buf);
    if (out->kind != V_STR)
        return oom(r, at);
    return 0;
}

int jinja_value_stringify(struct render *r, const struct value *v, struct value *out, const struct node *at)
{
    if (v->kind == V_STR) {
        *out = *v;
        return 0;
    }
    struct strbuf b = {.limit = r->lim.max_output_bytes};
    if (jinja_value_to_str(&b, v, false, 0)) {
        bool over = b.failed; /* the limit, or memory */
        strbuf_free(&b);
        return over ? oom(r, at) : jinja_error(r, at, "value nested too deeply to print");
    }
    *out = v_str(&r->arena, b.data ? b.data : "", b.len);
    strbuf_free(&b);
    return out->kind == V_STR ? 0 : oom(r, at);
}

static int call_macro(struct render *r, struct macro *m, struct value *args, size_t nargs, const char **kwnames,
                      struct value *kwvals, size_t nkw, const struct macro *caller, struct value *out,
                      const struct node *at)
{
    if (r->depth >= r->lim.max_depth)
        return jinja_error(r, at, "macro recursion deeper than %d", r->lim.max_depth);
    const struct node *def = m->def;
    struct scope *s = scope_new(r, (struct scope *)m->closure);
    if (!s)
        return oom(r, at);
    struct value varargs = v_list(&r->arena), kwargs = v_dict(&r->arena);
    if (varargs.kind != V_LIST || kwargs.kind != V_DICT)
        return oom(r, at);
    varargs.is_tuple = true;
    for (size_t i = 0; i < nargs; i++) {
        if (i < def->n_names) {
            if (scope_set(r, s, def->names[i], args[i], at))
                return -1;
        } else if (jinja_list_push(&r->arena, varargs.u.l, args[i])) {
            return oom(r, at);
        }
    }
    for (size_t k = 0; k < nkw; k++) {
        bool found = false;
        for (size_t i = 0; i < def->n_names; i++)
            if (strcmp(def->names[i], kwnames[k]) == 0) {
                if (i < nargs)
                    return jinja_error(r, at, "macro '%s' got multiple values for argument '%s'",
                                    def->name ? def->name : "caller", kwnames[k]);
                found = true;
                if (scope_set(r, s, def->names[i], kwvals[k], at))
                    return -1;
            }
        if (!found && jinja_dict_set(&r->arena, kwargs.u.d, v_cstr(kwnames[k]), kwvals[k]))
            return oom(r, at);
    }
    for (size_t i = nargs; i < def->n_names; i++) {
        if (jinja_dict_get_str(s->vars, def->names[i]))
            continue;
        struct value dv = v_undef();
        if (i < def->items2.n && def->items2.v[i]) {
            int rc = eval(r, s, def->items2.v[i], &dv);
            if (rc)
                return rc;
        }
        if (scope_set(r, s, def->names[i], dv, at))
            return -1;
    }
    if (scope_set(r, s, "varargs", varargs, at) || scope_set(r, s, "kwargs", kwargs, at))
        return -1;
    if (caller) {
        struct value cv = {.kind = V_MACRO};
        cv.u.m = (struct macro *)caller;
        if (scope_set(r, s, "caller", cv, at))
            return -1;
    }
    r->depth++;
    int rc = render_body_to_string(r, s, &def->items, out, at);
    r->depth--;
    return rc;
}

static int call_value(struct render *r, struct value *fn, struct value *args, size_t nargs, const char **kwnames,
                      struct value *kwvals, size_t nkw, struct value *out, const struct node *at)
{
    if (fn->kind == V_MACRO)
        return call_macro(r, fn->u.m, args, nargs, kwnames, kwvals, nkw, NULL, out, at);
    if (fn->kind == V_BUILTIN) {
        if (r->depth >= r->lim.max_depth)
            return jinja_error(r, at, "call recursion deeper than %d", r->lim.max_depth);
        r->depth++;
        int rc = fn->u.fn->fn(r, fn->u.fn, args, nargs, kwnames, kwvals, nkw, out, at);
        r->depth--;
        return rc;
    }
    if (fn->kind == V_UNDEF) {
        if (at && at->kind == N_CALL && at->a->kind == N_NAME)
            return jinja_error(r, at, "'%s' is undefined", at->a->name);
        if (at && at->kind == N_CALL && at->a->kind == N_GETATTR)
            return jinja_error(r, at, "'%s' is undefined", at->a->name);
        return jinja_error(r, at, "called an undefined value");
    }
    return jinja_error(r, at, "'%s' object is not callable", jinja_value_type_name(fn));
}

/* Evaluates call arguments into arena arrays. */
static int eval_args(struct render *r, struct scope *s, const struct node *n, struct value **args,
                     const char ***kwnames, struct value **kwvals)
{
    *args = jinja_arena_alloc(&r->arena, (n->items.n + 1) * sizeof(struct value));
    *kwnames = jinja_arena_alloc(&r->arena, (n->n_kw + 1) * sizeof(char *));
    *kwvals = jinja_arena_alloc(&r->arena, (n->n_kw + 1) * sizeof(struct value));
    if (!*args || !*kwnames || !*kwvals)
        return oom(r, n);
    for (size_t i = 0; i < n->items.n; i++) {
        int rc = eval(r, s, n->items.v[i], &(*args)[i]);
        if (rc)
            return rc;
    }
    for (size_t k = 0; k < n->n_kw; k++) {
        (*kwnames)[k] = n->kw[k].name;
        int rc = eval(r, s, n->kw[k].val, &(*kwvals)[k]);
        if (rc)
            return rc;
    }
    return 0;
}

static int64_t py_floordiv(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0)))
        q--;
    return q;
}

/* CPython's float_floor_div: derived from fmod so that 1.5 // 0.1 == 14.0 */
static double py_float_floordiv(double vx, double wx)
{
    double mod = fmod(vx, wx), div = (vx - mod) / wx;
    if (mod != 0 && ((wx < 0) != (mod < 0)))
        div -= 1.0;
    if (div == 0)
        return copysign(0.0, vx / wx);
    double fl = floor(div);
    if (div - fl > 0.5)
        fl += 1.0;
    return fl;
}

static int64_t py_mod(int64_t a, int64_t b)
{
    int64_t m = a % b;
    if (m != 0 && ((m < 0) != (b < 0)))
        m += b;
    return m;
}

static bool is_numv(const struct value *v) { return v->kind == V_INT || v->kind == V_FLOAT || v->kind == V_BOOL; }
static double fval(const struct value *v)
{
    return v->kind == V_FLOAT ? v->u.f : v->kind == V_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t ival(const struct value *v) { return v->kind == V_INT ? v->u.i : (int64_t)v->u.b; }

static int repeat(struct render *r, const struct value *seq, int64_t times, struct value *out, const struct node *at)
{
    if (times < 0)
        times = 0;
    if (seq->kind == V_STR) {
        if (seq->u.s.n && (uint64_t)times > r->lim.max_output_bytes / seq->u.s.n)
            return jinja_error(r, at, "string repetition larger than the output limit");
        size_t total = seq->u.s.n * (size_t)times;
        char *p = jinja_arena_alloc(&r->arena, total + 1);
        if (!p)
            return oom(r, at);
        for (int64_t i = 0; i < times; i++)
            memcpy(p + (size_t)i * seq->u.s.n, seq->u.s.p, seq->u.s.n);
        out->kind = V_STR;
        out->is_tuple = false;
        out->u.s.p = p;
        out->u.s.n = total;
        return 0;
    }
    size_t n = seq->u.l->n;
    if (n && (uint64_t)times > (uint64_t)r->lim.max_steps / n)
        return jinja_error(r, at, "list repetition too large");
    r->steps += (long)(n * (size_t)times);
    int rc = step(r, at);
    if (rc)
        return rc;
    *out = v_list(&r->arena);
    if (out->kind != V_LIST)
        return oom(r, at);
    out->is_tuple = seq->is_tuple;
    for (int64_t i = 0; i < times; i++)
        for (size_t j = 0; j < n; j++)
            if (jinja_list_push(&r->arena, out->u.l, seq->u.l->v[j]))
                return oom(r, at);
    return 0;
}

static int concat_str(struct render *r, const struct value *a, const struct value *b, struct value *out,
                      const struct node *at)
{
    if (a->u.s.n + b->u.s.n > r->lim.max_output_bytes)
        return jinja_error(r, at, "string longer than the output limit");
    char *p = jinja_arena_alloc(&r->arena, a->u.s.n + b->u.s.n + 1);
    if (!p)
        return oom(r, at);
    memcpy(p, a->u.s.p, a->u.s.n);
    memcpy(p + a->u.s.n, b->u.s.p, b->u.s.n);
    out->kind = V_STR;
    out->is_tuple = false;
    out->u.s.p = p;
    out->u.s.n = a->u.s.n + b->u.s.n;
    return 0;
}

static int binop(struct render *r, const char *op, struct value *a, struct value *b, struct value *out,
                 const struct node *at)
{
    if (op[0] == '~') {
        struct value sa, sb;
        if (jinja_value_stringify(r, a, &sa, at) || jinja_value_stringify(r, b, &sb, at))
            return -1;
        return concat_str(r, &sa, &sb, out, at);
    }
    bool nums = is_numv(a) && is_numv(b);
    bool ints = nums && a->kind != V_FLOAT && b->kind != V_FLOAT;
    if (strcmp(op, "+") == 0) {
        if (ints) {
            int64_t res;
            if (__builtin_add_overflow(ival(a), ival(b), &res))
                return jinja_error(r, at, "integer overflow in '+'");
            *out = v_int(res);
            return 0;
        }
        if (nums) {
            *out = v_float(fval(a) + fval(b));
            return 0;
        }
        if (a->kind == V_STR && b->kind == V_STR)
            return concat_str(r, a, b, out, at);
        if (a->kind == V_LIST && b->kind == V_LIST) {
            *out = v_list(&r->arena);
            if (out->kind != V_LIST)
                return oom(r, at);
            for (size_t i = 0; i < a->u.l->n; i++)
                if (jinja_list_push(&r->arena, out->u.l, a->u.l->v[i]))
                    return oom(r, at);
            for (size_t i = 0; i < b->u.l->n; i++)
                if (jinja_list_push(&r->arena, out->u.l, b->u.l->v[i]))
                    return oom(r, at);
            return 0;
        }
    } else if (strcmp(op, "-") == 0) {
        if (ints) {
            int64_t res;
            if (__builtin_sub_overflow(ival(a), ival(b), &res))
                return jinja_error(r, at, "integer overflow in '-'");
            *out = v_int(res);
            return 0;
        }
        if (nums) {
            *out = v_float(fval(a) - fval(b));
            return 0;
        }
    } else if (strcmp(op, "*") == 0) {
        if (ints) {
            int64_t res;
            if (__builtin_mul_overflow(ival(a), ival(b), &res))
                return jinja_error(r, at, "integer overflow in '*'");
            *out = v_int(res);
            return 0;
        }
        if (nums) {
            *out = v_float(fval(a) * fval(b));
            return 0;
        }
        if ((a->kind == V_STR || a->kind == V_LIST) && (b->kind == V_INT || b->kind == V_BOOL))
            return repeat(r, a, ival(b), out, at);
        if ((b->kind == V_STR || b->kind == V_LIST) && (a->kind == V_INT || a->kind == V_BOOL))
            return repeat(r, b, ival(a), out, at);
    } else if (strcmp(op, "/") == 0) {
        if (nums) {
            if (fval(b) == 0)
                return jinja_error(r, at, "division by zero");
            *out = v_float(fval(a) / fval(b));
            return 0;
        }
    } else if (strcmp(op, "//") == 0) {
        if (nums) {
            if (fval(b) == 0)
                return jinja_error(r, at, "integer division by zero");
            if (ints) {
                if (ival(a) == INT64_MIN && ival(b) == -1)
                    return jinja_error(r, at, "integer overflow in '//'");
                *out = v_int(py_floordiv(ival(a), ival(b)));
            } else {
                *out = v_float(py_float_floordiv(fval(a), fval(b)));
            }
            return 0;
        }
    } else if (strcmp(op, "%") == 0) {
        if (nums) {
            if (fval(b) == 0)
                return jinja_error(r, at, "modulo by zero");
            if (ints) {
                if (ival(b) == -1) {
                    *out = v_int(0);
                    return 0;
                }
                *out = v_int(py_mod(ival(a), ival(b)));
            } else {
                double m = fmod(fval(a), fval(b));
                if (m != 0 && ((m < 0) != (fval(b) < 0)))
                    m += fval(b);
                else if (m == 0)
                    m = copysign(0.0, fval(b)); /* Python: a zero result takes the divisor's sign */
                *out = v_float(m);
            }
            return 0;
        }
        if (a->kind == V_STR)
            return jinja_error(r, at, "%%-formatting of strings is not supported");
    } else if (strcmp(op, "**") == 0) {
        if (ints && ival(b) >= 0) {
            int64_t base = ival(a), e = ival(b), res = 1;
            while (e > 0) {
                if ((e & 1) && __builtin_mul_overflow(res, base, &res))
                    return jinja_error(r, at, "integer overflow in '**'");
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base))
                    return jinja_error(r, at, "integer overflow in '**'");
            }
            *out = v_int(res);
            return 0;
        }
        if (nums) {
            if (fval(a) == 0 && fval(b) < 0)
                return jinja_error(r, at, "zero to a negative power");
            *out = v_float(pow(fval(a), fval(b)));
            return 0;
        }
    }
    return jinja_error(r, at, "unsupported operand types for %s: '%s' and '%s'", op, jinja_value_type_name(a), jinja_value_type_name(b));
}

static bool contains(const struct value *item, const struct value *c, bool *ok)
{
    *ok = true;
    switch (c->kind) {
    case V_STR:
        if (item->kind != V_STR) {
            *ok = false;
            return false;
        }
        if (item->u.s.n == 0)
            return true;
        if (item->u.s.n > c->u.s.n)
            return false;
        for (size_t i = 0; i + item->u.s.n <= c->u.s.n; i++)
            if (memcmp(c->u.s.p + i, item->u.s.p, item->u.s.n) == 0)
                return true;
        return false;
    case V_LIST:
        for (size_t i = 0; i < c->u.l->n; i++)
            if (jinja_value_equal(item, &c->u.l->v[i]))
                return true;
        return false;
    case V_DICT: case V_NS: return jinja_dict_get(c->u.d, *item) != NULL;
    case V_UNDEF: return false;
    default: *ok = false; return false;
    }
}

static int compare(struct render *r, const char *op, struct value *a, struct value *b, struct value *out,
                   const struct node *at)
{
    if (strcmp(op, "==") == 0) {
        *out = v_bool(jinja_value_equal(a, b));
        return 0;
    }
    if (strcmp(op, "!=") == 0) {
        *out = v_bool(!jinja_value_equal(a, b));
        return 0;
    }
    if (strcmp(op, "in") == 0 || strcmp(op, "not in") == 0) {
        bool ok;
        bool in = contains(a, b, &ok);
        if (!ok)
            return jinja_error(r, at, "'in <%s>' requires a container, got '%s' in it", jinja_value_type_name(b),
                            jinja_value_type_name(a));
        *out = v_bool(op[0] == 'i' ? in : !in);
        return 0;
    }
    int c;
    if (jinja_value_compare(a, b, &c))
        return jinja_error(r, at, "'%s' not supported between '%s' and '%s'", op, jinja_value_type_name(a), jinja_value_type_name(b));
    bool res = strcmp(op, "<") == 0 ? c < 0 : strcmp(op, "<=") == 0 ? c <= 0 : strcmp(op, ">") == 0 ? c > 0 : c >= 0;
    *out = v_bool(res);
    return 0;
}

static int getitem(struct render *r, struct value *obj, struct value *key, struct value *out, const struct node *at)
{
    *out = v_undef();
    if (obj->kind == V_LIST || obj->kind == V_STR) {
        if (key->kind != V_INT && key->kind != V_BOOL) {
            if (key->kind == V_STR)
                return jinja_getattr(r, obj, key->u.s.p, out, at);
            return jinja_error(r, at, "%s indices must be integers, not %s", jinja_value_type_name(obj), jinja_value_type_name(key));
        }
        int64_t i = ival(key);
        size_t len = obj->kind == V_LIST ? obj->u.l->n : jinja_utf8_len(obj->u.s.p, obj->u.s.n);
        if (i < 0)
            i += (int64_t)len;
        if (i < 0 || (uint64_t)i >= len)
            return 0; /* jinja2: out-of-range index is undefined */
        if (obj->kind == V_LIST) {
            *out = obj->u.l->v[i];
        } else {
            size_t o = jinja_utf8_offset(obj->u.s.p, obj->u.s.n, (size_t)i);
            size_t e = o + 1;
            while (e < obj->u.s.n && ((unsigned char)obj->u.s.p[e] & 0xC0) == 0x80)
                e++;
            *out = v_str(&r->arena, obj->u.s.p + o, e - o);
            if (out->kind != V_STR)
                return oom(r, at);
        }
        return 0;
    }
    if (obj->kind == V_DICT || obj->kind == V_NS) {
        struct value *v = jinja_dict_get(obj->u.d, *key);
        if (v) {
            *out = *v;
            return 0;
        }
        if (key->kind == V_STR && obj->kind == V_DICT)
            return jinja_getattr(r, obj, key->u.s.p, out, at);
        return 0;
    }
    return 0;
}

static int slice(struct render *r, struct value *obj, struct value *lo, struct value *hi, struct value *st,
                 struct value *out, const struct node *at)
{
    if (obj->kind == V_UNDEF) {
        *out = v_undef();
        return 0;
    }
    if (obj->kind != V_LIST && obj->kind != V_STR)
        return jinja_error(r, at, "cannot slice a '%s'", jinja_value_type_name(obj));
    for (struct value *x = lo; x; x = x == lo ? hi : x == hi ? st : NULL)
        if (x->kind != V_NONE && x->kind != V_UNDEF && x->kind != V_INT && x->kind != V_BOOL)
            return jinja_error(r, at, "slice indices must be integers or None");
    int64_t len = obj->kind == V_LIST ? (int64_t)obj->u.l->n : (int64_t)jinja_utf8_len(obj->u.s.p, obj->u.s.n);
    int64_t stepv = (st->kind == V_INT || st->kind == V_BOOL) ? ival(st) : 1;
    if (stepv == 0)
        return jinja_error(r, at, "slice step cannot be zero");
    bool has_lo = lo->kind == V_INT || lo->kind == V_BOOL, has_hi = hi->kind == V_INT || hi->kind == V_BOOL;
    int64_t start, stop;
    /* CPython's PySlice_AdjustIndices */
    if (stepv > 0) {
        start = has_lo ? ival(lo) : 0;
        stop = has_hi ? ival(hi) : len;
        if (start < 0) { start += len; if (start < 0) start = 0; } else if (start > len) start = len;
        if (stop < 0) { stop += len; if (stop < 0) stop = 0; } else if (stop > len) stop = len;
    } else {
        start = has_lo ? ival(lo) : len - 1;
        stop = has_hi ? ival(hi) : -1;
        if (has_lo) { if (start < 0) { start += len; if (start < 0) start = -1; } else if (start >= len) start = len - 1; }
        if (has_hi) { if (stop < 0) { stop += len; if (stop < 0) stop = -1; } else if (stop >= len) stop = len - 1; }
    }
    size_t *offs = NULL;
    if (obj->kind == V_STR) {
        offs = jinja_arena_alloc(&r->arena, ((size_t)len + 1) * sizeof(size_t));
        if (!offs)
            return oom(r, at);
        size_t c = 0;
        for (size_t i = 0; i < obj->u.s.n; i++)
            if (((unsigned char)obj->u.s.p[i] & 0xC0) != 0x80)
                offs[c++] = i;
        offs[c] = obj->u.s.n;
    }
    struct value res = obj->kind == V_LIST ? v_list(&r->arena) : (struct value){.kind = V_STR};
    struct strbuf sb = {0};
    for (int64_t i = start; stepv > 0 ? i < stop : i > stop; i += stepv) {
        if (obj->kind == V_LIST) {
            if (res.kind != V_LIST || jinja_list_push(&r->arena, res.u.l, obj->u.l->v[i]))
                return oom(r, at);
        } else if (jinja_put(&sb, obj->u.s.p + offs[i], offs[i + 1] - offs[i])) {
            strbuf_free(&sb);
            return oom(r, at);
        }
    }
    if (obj->kind == V_STR) {
        res = v_str(&r->arena, sb.data ? sb.data : "", sb.len);
        strbuf_free(&sb);
        if (res.kind != V_STR)
            return oom(r, at);
    } else {
        res.is_tuple = obj->is_tuple;
    }
    *out = res;
    return 0;
}

static int eval_filter_chain(struct render *r, struct scope *s, const struct node *f, struct value *input,
                             struct value *out)
{
    struct value in;
    if (f->a) {
        int rc = eval(r, s, f->a, &in);
        if (rc)
            return rc;
    } else {
        in = *input;
    }
    if (f->kind != N_FILTER) {
        *out = in;
        return 0;
    }
    struct value *args;
    const char **kwn;
    struct value *kwv;
    int rc = eval_args(r, s, f, &args, &kwn, &kwv);
    if (rc)
        return rc;
    return jinja_apply_filter(r, f->name, &in, args, f->items.n, kwn, kwv, f->n_kw, out, f);
}

static int eval_filter_block_chain(struct render *r, struct scope *s, const struct node *f, struct value *input,
                                   struct value *out)
{
    /* chain nodes nest outward: innermost has a == NULL and receives input */
    struct value in = *input;
    if (f->a) {
        int rc = eval_filter_block_chain(r, s, f->a, input, &in);
        if (rc)
            return rc;
    }
    struct value *args;
    const char **kwn;
    struct value *kwv;
    int rc = eval_args(r, s, f, &args, &kwn, &kwv);
    if (rc)
        return rc;
    return jinja_apply_filter(r, f->name, &in, args, f->items.n, kwn, kwv, f->n_kw, out, f);
}

#define MAX_NATIVE_DEPTH 3000

static int eval_node(struct render *r, struct scope *s, const struct node *n, struct value *out);

static int eval(struct render *r, struct scope *s, const struct node *n, struct value *out)
{
    if (r->native >= MAX_NATIVE_DEPTH)
        return jinja_error(r, n, "template nested too deeply at run time");
    r->native++;
    int rc = eval_node(r, s, n, out);
    r->native--;
    return rc;
}

static int eval_node(struct render *r, struct scope *s, const struct node *n, struct value *out)
{
    int rc = step(r, n);
    if (rc)
        return rc;
    *out = v_undef();
    switch (n->kind) {
    case N_CONST:
        *out = *n->cval;
        return 0;
    case N_NAME: {
        struct value *v = scope_lookup(s, n->name);
        if (v) {
            *out = *v;
            return 0;
        }
        jinja_global_builtin(n->name, out);
        return 0;
    }
    case N_LIST: case N_TUPLE: {
        struct value l = v_list(&r->arena);
        if (l.kind != V_LIST)
            return oom(r, n);
        l.is_tuple = n->kind == N_TUPLE;
        for (size_t i = 0; i < n->items.n; i++) {
            struct value x;
            if ((rc = eval(r, s, n->items.v[i], &x)))
                return rc;
            if (jinja_list_push(&r->arena, l.u.l, x))
                return oom(r, n);
        }
        *out = l;
        return 0;
    }
    case N_DICT: {
        struct value d = v_dict(&r->arena);
        if (d.kind != V_DICT)
            return oom(r, n);
        for (size_t i = 0; i < n->items.n; i++) {
            struct value k, v;
            if ((rc = eval(r, s, n->items.v[i], &k)) || (rc = eval(r, s, n->items2.v[i], &v)))
                return rc;
            if (k.kind == V_LIST || k.kind == V_DICT || k.kind == V_NS)
                return jinja_error(r, n, "unhashable type: '%s'", jinja_value_type_name(&k));
            if (jinja_dict_set(&r->arena, d.u.d, k, v))
                return oom(r, n);
        }
        *out = d;
        return 0;
    }
    case N_GETATTR: {
        struct value obj;
        if ((rc = eval(r, s, n->a, &obj)))
            return rc;
        return jinja_getattr(r, &obj, n->name, out, n);
    }
    case N_GETITEM: {
        struct value obj, key;
        if ((rc = eval(r, s, n->a, &obj)) || (rc = eval(r, s, n->b, &key)))
            return rc;
        return getitem(r, &obj, &key, out, n);
    }
    case N_SLICE: {
        struct value obj, lo = v_none(), hi = v_none(), st = v_none();
        if ((rc = eval(r, s, n->a, &obj)))
            return rc;
        if (n->b && (rc = eval(r, s, n->b, &lo)))
            return rc;
        if (n->c && (rc = eval(r, s, n->c, &hi)))
            return rc;
        if (n->items.n && (rc = eval(r, s, n->items.v[0], &st)))
            return rc;
        return slice(r, &obj, &lo, &hi, &st, out, n);
    }
    case N_CALL: {
        struct value fn;
        if ((rc = eval(r, s, n->a, &fn)))
            return rc;
        struct value *args;
        const char **kwn;
        struct value *kwv;
        if ((rc = eval_args(r, s, n, &args, &kwn, &kwv)))
            return rc;
        return call_value(r, &fn, args, n->items.n, kwn, kwv, n->n_kw, out, n);
    }
    case N_FILTER:
        return eval_filter_chain(r, s, n, NULL, out);
    case N_TEST: {
        struct value in;
        if ((rc = eval(r, s, n->a, &in)))
            return rc;
        struct value *args;
        const char **kwn;
        struct value *kwv;
        if ((rc = eval_args(r, s, n, &args, &kwn, &kwv)))
            return rc;
        bool res;
        if ((rc = jinja_apply_test(r, n->name, &in, args, n->items.n, &res, n)))
            return rc;
        *out = v_bool(n->negate ? !res : res);
        return 0;
    }
    case N_UNARY: {
        struct value x;
        if ((rc = eval(r, s, n->a, &x)))
            return rc;
        if (x.kind == V_INT || x.kind == V_BOOL) {
            if (n->op[0] == '-' && ival(&x) == INT64_MIN)
                return jinja_error(r, n, "integer overflow in unary '-'");
            *out = v_int(n->op[0] == '-' ? -ival(&x) : ival(&x));
        } else if (x.kind == V_FLOAT) {
            *out = v_float(n->op[0] == '-' ? -x.u.f : x.u.f);
        } else {
            return jinja_error(r, n, "bad operand type for unary %s: '%s'", n->op, jinja_value_type_name(&x));
        }
        return 0;
    }
    case N_BINARY: {
        struct value a, b;
        if ((rc = eval(r, s, n->a, &a)) || (rc = eval(r, s, n->b, &b)))
            return rc;
        return binop(r, n->op, &a, &b, out, n);
    }
    case N_COMPARE: {
        struct value a, b;
        if ((rc = eval(r, s, n->a, &a)) || (rc = eval(r, s, n->b, &b)))
            return rc;
        return compare(r, n->op, &a, &b, out, n);
    }
    case N_AND: case N_OR: {
        struct value a;
        if ((rc = eval(r, s, n->a, &a)))
            return rc;
        bool t = jinja_value_truthy(&a);
        if ((n->kind == N_AND && !t) || (n->kind == N_OR && t)) {
            *out = a;
            return 0;
        }
        return eval(r, s, n->b, out);
    }
    case N_NOT: {
        struct value a;
        if ((rc = eval(r, s, n->a, &a)))
            return rc;
        *out = v_bool(!jinja_value_truthy(&a));
        return 0;
    }
    case N_COND: {
        struct value c;
        if ((rc = eval(r, s, n->a, &c)))
            return rc;
        if (jinja_value_truthy(&c))
            return eval(r, s, n->b, out);
        if (n->c)
            return eval(r, s, n->c, out);
        *out = v_undef();
        return 0;
    }
    default:
        return jinja_error(r, n, "statement used as an expression");
    }
}

/* ---- statements ---- */

/* Turns an iterable into a list of items (dict -> keys, str -> characters). */
static int iter_items(struct render *r, struct value *v, struct value *out, const struct node *at)
{
    if (v->kind == V_LIST) {
        *out = *v;
        return 0;
    }
    *out = v_list(&r->arena);
    if (out->kind != V_LIST)
        return oom(r, at);
    switch (v->kind) {
    case V_UNDEF: return 0;
    case V_DICT: case V_NS:
        for (size_t i = 0; i < v->u.d->n; i++)
            if (jinja_list_push(&r->arena, out->u.l, v->u.d->keys[i]))
                return oom(r, at);
        return 0;
    case V_STR:
        for (size_t i = 0; i < v->u.s.n;) {
            size_t e = i + 1;
            while (e < v->u.s.n && ((unsigned char)v->u.s.p[e] & 0xC0) == 0x80)
                e++;
            struct value c = v_str(&r->arena, v->u.s.p + i, e - i);
            if (c.kind != V_STR || jinja_list_push(&r->arena, out->u.l, c))
                return oom(r, at);
            i = e;
        }
        return 0;
    default:
        return jinja_error(r, at, "'%s' object is not iterable", jinja_value_type_name(v));
    }
}

static int bind_targets(struct render *r, struct scope *s, const struct node *n, struct value *item)
{
    if (n->n_names == 1)
        return scope_set(r, s, n->names[0], *item, n);
    struct value items;
    int rc = iter_items(r, item, &items, n);
    if (rc)
        return rc;
    if (items.u.l->n != n->n_names)
        return jinja_error(r, n, "cannot unpack %zu values into %zu names", items.u.l->n, n->n_names);
    for (size_t i = 0; i < n->n_names; i++)
        if ((rc = scope_set(r, s, n->names[i], items.u.l->v[i], n)))
            return rc;
    return 0;
}

static int loop_cycle(struct render *r, struct builtin *b, struct value *args, size_t nargs, const char **kwn,
                      struct value *kwv, size_t nkw, struct value *out, const struct node *at)
{
    if (nargs == 0)
        return jinja_error(r, at, "loop.cycle() needs at least one argument");
    struct value *idx = jinja_dict_get_str(b->self->u.d, "index0");
    int64_t i = idx && idx->kind == V_INT ? idx->u.i : 0;
    *out = args[i % (int64_t)nargs];
    return 0;
}

static int exec_for(struct render *r, struct scope *s, const struct node *n)
{
    struct value seqv, items;
    int rc = eval(r, s, n->a, &seqv);
    if (rc)
        return rc;
    if ((rc = iter_items(r, &seqv, &items, n)))
        return rc;
    if (n->b) { /* loop filter: {% for x in y if cond %} */
        struct value kept = v_list(&r->arena);
        if (kept.kind != V_LIST)
            return oom(r, n);
        for (size_t i = 0; i < items.u.l->n; i++) {
            struct scope *fs = scope_new(r, s);
            if (!fs)
                return oom(r, n);
            struct value c;
            if ((rc = bind_targets(r, fs, n, &items.u.l->v[i])) || (rc = eval(r, fs, n->b, &c)))
                return rc;
            if (jinja_value_truthy(&c) && jinja_list_push(&r->arena, kept.u.l, items.u.l->v[i]))
                return oom(r, n);
        }
        items = kept;
    }
    size_t len = items.u.l->n;
    /* iterate over a snapshot so appends inside the loop do not extend it */
    struct value *snap = jinja_arena_alloc(&r->arena, (len + 1) * sizeof(struct value));
    if (!snap)
        return oom(r, n);
    if (len)
        memcpy(snap, items.u.l->v, len * sizeof(struct value));
    struct builtin *cyc = jinja_arena_alloc(&r->arena, sizeof(*cyc));
    if (!cyc)
        return oom(r, n);
    cyc->name = "cycle";
    cyc->fn = loop_cycle;
    for (size_t i = 0; i < len; i++) {
        if ((rc = step(r, n)))
            return rc;
        struct scope *ls = scope_new(r, s);
        struct value loop = v_dict(&r->arena);
        if (!ls || loop.kind != V_DICT)
            return oom(r, n);
        struct builtin *bc = jinja_arena_alloc(&r->arena, sizeof(*bc));
        struct value *self = jinja_arena_alloc(&r->arena, sizeof(*self));
        if (!bc || !self)
            return oom(r, n);
        *bc = *cyc;
        *self = loop;
        bc->self = self;
        struct value cv = {.kind = V_BUILTIN};
        cv.u.fn = bc;
        struct arena *a = &r->arena;
        struct vdict *d = loop.u.d;
        if (jinja_dict_set(a, d, v_cstr("index"), v_int((int64_t)i + 1)) ||
            jinja_dict_set(a, d, v_cstr("index0"), v_int((int64_t)i)) ||
            jinja_dict_set(a, d, v_cstr("revindex"), v_int((int64_t)(len - i))) ||
            jinja_dict_set(a, d, v_cstr("revindex0"), v_int((int64_t)(len - i - 1))) ||
            jinja_dict_set(a, d, v_cstr("first"), v_bool(i == 0)) ||
            jinja_dict_set(a, d, v_cstr("last"), v_bool(i + 1 == len)) ||
            jinja_dict_set(a, d, v_cstr("length"), v_int((int64_t)len)) ||
            jinja_dict_set(a, d, v_cstr("previtem"), i > 0 ? snap[i - 1] : v_undef()) ||
            jinja_dict_set(a, d, v_cstr("nextitem"), i + 1 < len ? snap[i + 1] : v_undef()) ||
            jinja_dict_set(a, d, v_cstr("depth"), v_int(1)) || jinja_dict_set(a, d, v_cstr("depth0"), v_int(0)) ||
            jinja_dict_set(a, d, v_cstr("cycle"), cv))
            return oom(r, n);
        if ((rc = scope_set(r, ls, "loop", loop, n)) || (rc = bind_targets(r, ls, n, &snap[i])))
            return rc;
        rc = exec_body(r, ls, &n->items);
        if (rc < 0)
            return rc;
        if (rc == ST_BREAK)
            break;
    }
    if (len == 0 && n->items2.n) {
        rc = exec_body(r, s, &n->items2);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int exec_set(struct render *r, struct scope *s, const struct node *n)
{
    struct value v;
    int rc = eval(r, s, n->a, &v);
    if (rc)
        return rc;
    if (n->attr) {
        struct value *ns = scope_lookup(s, n->name);
        if (!ns || ns->kind != V_NS)
            return jinja_error(r, n, "cannot assign attribute '%s' on '%s': not a namespace", n->attr, n->name);
        if (jinja_dict_set(&r->arena, ns->u.d, v_cstr(n->attr), v))
            return oom(r, n);
        return 0;
    }
    return bind_targets(r, s, n, &v);
}

static int emit(struct render *r, const char *p, size_t len, const struct node *at)
{
    if (jinja_put(r->out, p, len))
        return oom(r, at);
    return 0;
}

static int exec_one(struct render *r, struct scope *s, const struct node *n);

static int exec_node(struct render *r, struct scope *s, const struct node *n)
{
    if (r->native >= MAX_NATIVE_DEPTH)
        return jinja_error(r, n, "template nested too deeply at run time");
    r->native++;
    int rc = exec_one(r, s, n);
    r->native--;
    return rc;
}

static int exec_one(struct render *r, struct scope *s, const struct node *n)
{
    int rc = step(r, n);
    if (rc)
        return rc;
    switch (n->kind) {
    case N_TEXT:
        return emit(r, n->text, n->text_len, n);
    case N_OUTPUT: {
        struct value v, sv;
        if ((rc = eval(r, s, n->a, &v)) || (rc = jinja_value_stringify(r, &v, &sv, n)))
            return rc;
        return emit(r, sv.u.s.p, sv.u.s.n, n);
    }
    case N_IF: {
        struct value c;
        if ((rc = eval(r, s, n->a, &c)))
            return rc;
        return exec_body(r, s, jinja_value_truthy(&c) ? &n->items : &n->items2);
    }
    case N_FOR:
        return exec_for(r, s, n);
    case N_SET:
        return exec_set(r, s, n);
    case N_SET_BLOCK: {
        struct value v, f;
        if ((rc = render_body_to_string(r, s, &n->items, &v, n)))
            return rc;
        if (n->b) {
            if ((rc = eval_filter_block_chain(r, s, n->b, &v, &f)))
                return rc;
            v = f;
        }
        return scope_set(r, s, n->names[0], v, n);
    }
    case N_MACRO: {
        struct macro *m = jinja_arena_alloc(&r->arena, sizeof(*m));
        if (!m)
            return oom(r, n);
        m->def = n;
        m->closure = s;
        struct value v = {.kind = V_MACRO};
        v.u.m = m;
        return scope_set(r, s, n->name, v, n);
    }
    case N_CALL_BLOCK: {
        struct macro *caller = jinja_arena_alloc(&r->arena, sizeof(*caller));
        if (!caller)
            return oom(r, n);
        caller->def = n;
        caller->closure = s;
        const struct node *call = n->a;
        struct value fn, *args, res;
        const char **kwn;
        struct value *kwv;
        if ((rc = eval(r, s, call->a, &fn)) || (rc = eval_args(r, s, call, &args, &kwn, &kwv)))
            return rc;
        if (fn.kind != V_MACRO)
            return jinja_error(r, n, "call block needs a macro, got '%s'", jinja_value_type_name(&fn));
        if ((rc = call_macro(r, fn.u.m, args, call->items.n, kwn, kwv, call->n_kw, caller, &res, n)))
            return rc;
        return emit(r, res.u.s.p, res.u.s.n, n);
    }
    case N_FILTER_BLOCK: {
        struct value v, f, sv;
        if ((rc = render_body_to_string(r, s, &n->items, &v, n)) ||
            (rc = eval_filter_block_chain(r, s, n->a, &v, &f)) || (rc = jinja_value_stringify(r, &f, &sv, n)))
            return rc;
        return emit(r, sv.u.s.p, sv.u.s.n, n);
    }
    case N_BREAK:
        return ST_BREAK;
    case N_CONTINUE:
        return ST_CONTINUE;
    case N_DO: {
        struct value v;
        return eval(r, s, n->a, &v);
    }
    case N_BODY:
        return exec_body(r, s, &n->items);
    default:
        return jinja_error(r, n, "expression used as a statement");
    }
}

static int exec_body(struct render *r, struct scope *s, const struct node_list *body)
{
    for (size_t i = 0; i < body->n; i++) {
        int rc = exec_node(r, s, body->v[i]);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- public API ---- */

void jinja_limits_default(struct jinja_limits *l)
{
    l->max_output_bytes = 16u << 20;
    l->max_steps = 50000000;
    l->max_depth = 256;
}

int jinja_render(const struct jinja_template *t, struct json_object *ctx, const struct jinja_limits *limits,
                 char **out, size_t *len, struct err *err)
{
    *out = NULL;
    if (len)
        *len = 0;
    struct err local = {0};
    if (!err)
        err = &local;
    err_clear(err);
    struct render r = {0};
    if (limits)
        r.lim = *limits;
    else
        jinja_limits_default(&r.lim);
    if (r.lim.max_depth <= 0)
        r.lim.max_depth = 1;
    r.err = err;
    size_t cap = r.lim.max_output_bytes * 16 + (64u << 20);
    r.arena.cap = cap < r.lim.max_output_bytes ? 0 : cap;
    struct strbuf buf = {.limit = r.lim.max_output_bytes};
    r.out = &buf;
    int rc = 0;
    r.globals = scope_new(&r, NULL);
    if (!r.globals) {
        rc = err_set(err, INFERD_ENOMEM, "template: out of memory");
        goto done;
    }
    if (ctx) {
        struct value c = jinja_value_from_json(&r.arena, ctx);
        if (c.kind != V_DICT) {
            rc = r.arena.over ? err_set(err, INFERD_ENOMEM, "template: context too large")
                              : err_set(err, INFERD_EINVAL, "template: context must be a JSON object");
            goto done;
        }
        for (size_t i = 0; i < c.u.d->n; i++)
            if (jinja_dict_set(&r.arena, r.globals->vars, c.u.d->keys[i], c.u.d->vals[i])) {
                rc = err_set(err, INFERD_ENOMEM, "template: out of memory");
                goto done;
            }
    }
    {
        /* the template body runs in its own scope above the context, as in Jinja */
        struct scope *top = scope_new(&r, r.globals);
        if (!top) {
            rc = err_set(err, INFERD_ENOMEM, "template: out of memory");
            goto done;
        }
        rc = exec_body(&r, top, &t->root->items);
        if (rc > 0)
            rc = 0; /* break/continue outside a loop */
        if (rc < 0 && err->code == 0)
            err_set(err, INFERD_EINVAL, "template: render failed");
    }
done:
    jinja_arena_free(&r.arena);
    if (rc < 0) {
        strbuf_free(&buf);
        return -err->code;
    }
    if (!(*out = strbuf_take(&buf, len)))
        return err_set(err, INFERD_ENOMEM, "template: out of memory");
    return 0;
}
