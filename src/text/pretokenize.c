/* text/pretokenize.c — tokenizer.json pre-tokenizers (Split, ByteLevel, Metaspace, Digits, Punctuation, Whitespace, ...) and the literal/regex patterns they split on. */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

/* ---------------------------------------------------------------- patterns */

/* PCRE2's \s in UCP mode also matches U+180E, which left White_Space in Unicode 6.3;
 * Oniguruma (HF's engine) follows the property, so \s and \S are rewritten to it. */
static int translate_regex(const char *re, size_t len, struct strbuf *out, struct err *err)
{
    int rc = tok_put(out, "", 0, err);
    for (size_t i = 0; rc == 0 && i < len; i++) {
        if (re[i] == '\\' && i + 1 < len && (re[i + 1] == 's' || re[i + 1] == 'S')) {
            rc = tok_put(out, re[i + 1] == 's' ? "\\p{White_Space}" : "\\P{White_Space}", 15, err);
            i++;
        } else if (re[i] == '\\' && i + 1 < len) {
            rc = tok_put(out, re + i, 2, err);
            i++;
        } else {
            rc = tok_put(out, re + i, 1, err);
        }
    }
    return rc;
}

int tok_pattern_compile_regex(const char *re, size_t len, struct tok_pattern *p, struct err *err)
{
    int ec;
    PCRE2_SIZE eo;
    struct strbuf tr = {0};
    int rc = translate_regex(re, len, &tr, err);
    if (rc)
        return rc;
    p->re = pcre2_compile((PCRE2_SPTR)tr.data, tr.len, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    strbuf_free(&tr);
    if (!p->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return err_set(err, INFERD_EFORMAT, "tokenizer: regex '%.80s' at offset %zu: %s", re,
                       (size_t)eo, (const char *)msg);
    }
    /* JIT is an optimisation: a pattern the JIT refuses still matches through the interpreter. */
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE);
    return 0;
}

int tok_pattern_parse(const struct json_reader *j, struct tok_pattern *p, struct err *err)
{
    memset(p, 0, sizeof *p);
    struct json_reader obj;
    const char *re = NULL;
    size_t len = 0;
    bool is_regex = false, is_string = false;
    int rc;
    if ((rc = json_read_object(j, NULL, JSON_REQUIRED, &obj)) ||
        (rc = json_read_str(j, "Regex", &is_regex, &re, &len)))
        return rc;
    if (is_regex)
        return tok_pattern_compile_regex(re, len, p, err);
    if ((rc = json_read_strdup(j, "String", &is_string, &p->str, &p->len)))
        return rc;
    if (!is_string)
        return json_reader_fail(j, INFERD_EFORMAT, "needs a String or Regex member");
    return 0;
}

void tok_pattern_free(struct tok_pattern *p)
{
    free(p->str);
    if (p->re)
        pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

static size_t utf8_len_at(const char *s, size_t i)
{
    uint8_t b = (uint8_t)s[i];
    return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

int tok_pattern_find(const struct tok_pattern *p, const char *s, size_t len, struct spanlist *out,
                     struct err *err)
{
    out->n = 0;
    size_t prev = 0;
    int rc = 0;
    if (!p->re) {
        if (p->len == 0) {
            return len ? spanlist_push(out, 0, len, false, err) : 0;
        }
        size_t pos = 0;
        while (rc == 0 && pos + p->len <= len) {
            const char *hit = memmem(s + pos, len - pos, p->str, p->len);
            if (!hit)
                break;
            size_t ms = (size_t)(hit - s);
            if (ms > prev)
                rc = spanlist_push(out, prev, ms, false, err);
            if (rc == 0)
                rc = spanlist_push(out, ms, ms + p->len, true, err);
            prev = pos = ms + p->len;
        }
    } else {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re, NULL);
        if (!md)
            return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
        size_t pos = 0;
        while (rc == 0 && pos <= len) {
            int m = pcre2_match(p->re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (m == PCRE2_ERROR_NOMATCH)
                break;
            if (m < 0) {
                PCRE2_UCHAR msg[160];
                pcre2_get_error_message(m, msg, sizeof msg);
                rc = err_set(err, INFERD_EINVAL, "tokenizer: regex match failed: %s",
                             (const char *)msg);
                break;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me <= ms) {
                if (ms >= len)
                    break;
                pos = ms + utf8_len_at(s, ms);
                continue;
            }
            if (ms > prev)
                rc = spanlist_push(out, prev, ms, false, err);
            if (rc == 0)
                rc = spanlist_push(out, ms, me, true, err);
            prev = pos = me;
        }
        pcre2_match_data_free(md);
    }
    if (rc == 0 && prev < len)
        rc = spanlist_push(out, prev, len, false, err);
    return rc;
}

/* ---------------------------------------------------------------- byte map */

/* GPT-2's map, in closed form: printable bytes map to themselves; the 68 others
 * (0x00-0x20, 0x7F-0xA0, 0xAD), in order, to U+0100 onwards. */
static bool byte_is_direct(uint32_t b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t tok_byte_to_cp(uint8_t b)
{
    if (byte_is_direct(b))
        return b;
    if (b <= 0x20)
        return 256u + b;
    if (b <= 0xA0)
        return 256u + 33u + (b - 0x7Fu);
    return 256u + 33u + 34u; /* 0xAD */
}

int tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return byte_is_direct(cp) ? (int)cp : -1;
    if (cp < 256 + 33)
        return (int)(cp - 256);
    if (cp < 256 + 33 + 34)
        return (int)(0x7F + cp - (256 + 33));
    return cp == 256 + 33 + 34 ? 0xAD : -1;
}

/* ---------------------------------------------------------------- pre-tokenizers */

enum split_behavior { SB_REMOVED, SB_ISOLATED, SB_MERGED_PREV, SB_MERGED_NEXT, SB_CONTIGUOUS };

enum pretok_kind {
    PT_SPLIT,
    PT_BYTELEVEL,
    PT_METASPACE,
    PT_DIGITS,
    PT_PUNCTUATION,
    PT_WHITESPACE,
    PT_WHITESPACE_SPLIT,
    PT_CHAR_DELIMITER,
    PT_BERT,
    PT_SEQUENCE,
};

enum prepend_scheme { PREPEND_FIRST, PREPEND_ALWAYS, PREPEND_NEVER };

struct pretok {
    enum pretok_kind kind;
    struct tok_pattern pat; /* Split's pattern; ByteLevel's GPT-2 regex; Whitespace's regex */
    enum split_behavior behavior;
    bool invert;
    bool add_prefix_space, use_regex;     /* ByteLevel */
    uint32_t replacement;                 /* Metaspace */
    enum prepend_scheme prepend;          /* Metaspace */
    bool split;                           /* Metaspace */
    bool individual_digits;               /* Digits */
    uint32_t delimiter;                   /* CharDelimiterSplit */
    void **subs;                          /* owned; Sequence members, each a struct pretok * */
    size_t n_subs;
};

static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_behavior(const struct json_reader *j, enum split_behavior dflt,
                          enum split_behavior *out)
{
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous", NULL};
    int b = (int)dflt;
    int rc = json_read_enum(j, "behavior", JSON_OPTIONAL, names, &b);
    *out = (enum split_behavior)b;
    return rc;
}

void pretok_free(struct pretok *p)
{
    if (!p)
        return;
    tok_pattern_free(&p->pat);
    for (size_t i = 0; i < p->n_subs; i++)
        pretok_free(p->subs[i]);
    free(p->subs);
    free(p);
}

/* A Sequence member, for tok_json_components. */
static int parse_member(const struct json_reader *e, void **out, struct err *err)
{
    struct pretok *sub = NULL;
    int rc = pretok_parse(e, &sub, err);
    *out = sub;
    return rc;
}

int pretok_parse(const struct json_reader *j, struct pretok **out, struct err *err)
{
    static const char *const schemes[] = {"first", "always", "never", NULL};
    static const enum prepend_scheme scheme_of[] = {PREPEND_FIRST, PREPEND_ALWAYS, PREPEND_NEVER};
    *out = NULL;
    const char *type;
    int rc = tok_json_type(j, &type);
    if (rc)
        return rc;
    struct pretok *p = calloc(1, sizeof *p);
    if (!p)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    if (!strcmp(type, "Split")) {
        p->kind = PT_SPLIT;
        struct json_reader pat = json_reader_member(j, "pattern");
        if (!(rc = tok_pattern_parse(&pat, &p->pat, err)) &&
            !(rc = parse_behavior(j, SB_REMOVED, &p->behavior)))
            rc = json_read_bool(j, "invert", JSON_OPTIONAL, &p->invert);
    } else if (!strcmp(type, "ByteLevel")) {
        p->kind = PT_BYTELEVEL;
        p->add_prefix_space = p->use_regex = true;
        if (!(rc = json_read_bool(j, "add_prefix_space", JSON_OPTIONAL, &p->add_prefix_space)))
            rc = json_read_bool(j, "use_regex", JSON_OPTIONAL, &p->use_regex);
        if (!rc && p->use_regex)
            rc = tok_pattern_compile_regex(gpt2_regex, sizeof gpt2_regex - 1, &p->pat, err);
    } else if (!strcmp(type, "Metaspace")) {
        p->kind = PT_METASPACE;
        bool has_scheme = false, add_prefix_space = true;
        int scheme = 0;
        p->split = true;
        /* older files say add_prefix_space instead of prepend_scheme */
        if (!(rc = tok_json_char(j, "replacement", "\xE2\x96\x81", &p->replacement, err)) &&
            !(rc = json_read_enum(j, "prepend_scheme", &has_scheme, schemes, &scheme)) &&
            !has_scheme)
            rc = json_read_bool(j, "add_prefix_space", JSON_OPTIONAL, &add_prefix_space);
        if (!rc)
            rc = json_read_bool(j, "split", JSON_OPTIONAL, &p->split);
        p->prepend = has_scheme ? scheme_of[scheme]
                                : add_prefix_space ? PREPEND_ALWAYS : PREPEND_NEVER;
    } else if (!strcmp(type, "Digits")) {
        p->kind = PT_DIGITS;
        rc = json_read_bool(j, "individual_digits", JSON_OPTIONAL, &p->individual_digits);
    } else if (!strcmp(type, "Punctuation")) {
        p->kind = PT_PUNCTUATION;
        rc = parse_behavior(j, SB_ISOLATED, &p->behavior);
    } else if (!strcmp(type, "Whitespace")) {
        p->kind = PT_WHITESPACE;
        static const char ws_re[] = "\\w+|[^\\w\\s]+";
        rc = tok_pattern_compile_regex(ws_re, sizeof ws_re - 1, &p->pat, err);
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p->kind = PT_WHITESPACE_SPLIT;
    } else if (!strcmp(type, "CharDelimiterSplit")) {
        p->kind = PT_CHAR_DELIMITER;
        rc = tok_json_char(j, "delimiter", "", &p->delimiter, err);
    } else if (!strcmp(type, "BertPreTokenizer")) {
        p->kind = PT_BERT;
    } else if (!strcmp(type, "Sequence")) {
        p->kind = PT_SEQUENCE;
        rc = tok_json_components(j, "pretokenizers", parse_member, &p->subs, &p->n_subs, err);
    } else {
        rc = err_set(err, INFERD_EUNSUPPORTED, "tokenizer: unsupported pre_tokenizer type '%.60s'",
                     type);
    }
    if (rc) {
        pretok_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

/* Applies a split behaviour to spans covering pc and appends the kept parts to out. */
static int split_piece(const struct piece *pc, struct spanlist *sp, enum split_behavior b,
                       bool invert, struct plist *out, struct err *err)
{
    if (invert)
        for (size_t i = 0; i < sp->n; i++)
            sp->v[i].is_match = !sp->v[i].is_match;
    /* Rewrite in place: r spans, is_match now meaning "remove". */
    size_t r = 0;
    bool prev = false;
    if (b == SB_MERGED_NEXT) {
        size_t n = sp->n;
        for (size_t k = n; k-- > 0;) {
            struct span s = sp->v[k];
            if (s.is_match && !prev && r)
                sp->v[n - r].start = s.start;
            else
                sp->v[n - ++r] = (struct span){s.start, s.end, false};
            prev = s.is_match;
        }
        if (r)
            memmove(sp->v, sp->v + (n - r), r * sizeof *sp->v);
    } else {
        for (size_t k = 0; k < sp->n; k++) {
            struct span s = sp->v[k];
            switch (b) {
            case SB_ISOLATED:
                sp->v[r++] = (struct span){s.start, s.end, false};
                break;
            case SB_REMOVED:
                sp->v[r++] = s;
                break;
            case SB_CONTIGUOUS:
                if (r && s.is_match == prev)
                    sp->v[r - 1].end = s.end;
                else
                    sp->v[r++] = (struct span){s.start, s.end, false};
                break;
            case SB_MERGED_PREV:
                if (s.is_match && !prev && r)
                    sp->v[r - 1].end = s.end;
                else
                    sp->v[r++] = (struct span){s.start, s.end, false};
                break;
            default:
                break;
            }
            prev = s.is_match;
        }
    }
    for (size_t k = 0; k < r; k++) {
        struct span s = sp->v[k];
        if (s.is_match || s.end <= s.start)
            continue;
        int rc = plist_push(out, pc->s + s.start, s.end - s.start, pc->first && s.start == 0, err);
        if (rc)
            return rc;
    }
    return 0;
}

enum char_class { CC_DIGIT, CC_PUNCT, CC_WHITESPACE, CC_EQUAL };

/* Each character of the class is its own match (HF's char-predicate patterns). */
static int char_spans(const char *s, size_t len, enum char_class cc, uint32_t arg,
                      struct spanlist *out, struct err *err)
{
    out->n = 0;
    size_t i = 0, prev = 0;
    int rc = 0;
    while (rc == 0 && i < len) {
        size_t at = i;
        uint32_t cp = tok_utf8_next(s, len, &i);
        bool m = cc == CC_DIGIT        ? (cp >= '0' && cp <= '9')
                 : cc == CC_PUNCT      ? tok_is_punct(cp)
                 : cc == CC_WHITESPACE ? tok_is_whitespace(cp)
                                       : cp == arg;
        if (!m)
            continue;
        if (at > prev)
            rc = spanlist_push(out, prev, at, false, err);
        if (rc == 0)
            rc = spanlist_push(out, at, i, true, err);
        prev = i;
    }
    if (rc == 0 && prev < len)
        rc = spanlist_push(out, prev, len, false, err);
    return rc;
}

static int bytelevel_map(const struct piece *pc, struct plist *out, struct err *err)
{
    /* Every byte maps to a code point below U+0144: at most 2 bytes of UTF-8. */
    char stack[512];
    char *buf = pc->len * 2 <= sizeof stack ? stack : malloc(pc->len * 2);
    if (!buf)
        return err_set(err, INFERD_ENOMEM, "tokenizer: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < pc->len; i++)
        o += tok_utf8_put(tok_byte_to_cp((uint8_t)pc->s[i]), buf + o);
    int rc = plist_push(out, buf, o, pc->first, err);
    if (buf != stack)
        free(buf);
    return rc;
}

static int apply_one(const struct pretok *p, const struct piece *pc, struct plist *out,
                     struct spanlist *sp, struct err *err)
{
    int rc = 0;
    switch (p->kind) {
    case PT_SPLIT:
        if ((rc = tok_pattern_find(&p->pat, pc->s, pc->len, sp, err)))
            return rc;
        return split_piece(pc, sp, p->behavior, p->invert, out, err);
    case PT_BYTELEVEL: {
        bool prefix = p->add_prefix_space && (pc->len == 0 || pc->s[0] != ' ');
        if (!prefix && !p->use_regex)
            return bytelevel_map(pc, out, err);
        struct strbuf b = {0};
        if (prefix)
            rc = tok_put(&b, " ", 1, err);
        if (!rc)
            rc = tok_put(&b, pc->s, pc->len, err);
        struct piece whole = {b.data, b.len, pc->first};
        struct plist parts = {0};
        if (!rc && p->use_regex) {
            rc = tok_pattern_find(&p->pat, whole.s, whole.len, sp, err);
            if (!rc)
                rc = split_piece(&whole, sp, SB_ISOLATED, false, &parts, err);
        } else if (!rc) {
            rc = plist_push(&parts, whole.s, whole.len, whole.first, err);
        }
        for (size_t i = 0; !rc && i < parts.n; i++)
            rc = bytelevel_map(&parts.v[i], out, err);
        plist_free(&parts);
        strbuf_free(&b);
        return rc;
    }
    case PT_METASPACE: {
        char rep[4];
        size_t rn = tok_utf8_put(p->replacement, rep);
        struct strbuf b = {0};
        rc = tok_put(&b, "", 0, err);
        bool starts_with_rep = false;
        for (size_t i = 0; !rc && i < pc->len; i++) {
            if (pc->s[i] == ' ')
                rc = tok_put(&b, rep, rn, err);
            else
                rc = tok_put(&b, pc->s + i, 1, err);
        }
        if (!rc)
            starts_with_rep = b.len >= rn && !memcmp(b.data, rep, rn);
        bool prepend = !starts_with_rep && (p->prepend == PREPEND_ALWAYS ||
                                            (p->prepend == PREPEND_FIRST && pc->first));
        struct strbuf c = {0};
        if (!rc && prepend)
            rc = tok_put(&c, rep, rn, err);
        if (!rc)
            rc = tok_put(&c, b.data, b.len, err);
        strbuf_free(&b);
        struct piece whole = {c.data, c.len, pc->first};
        if (!rc && p->split) {
            rc = char_spans(whole.s, whole.len, CC_EQUAL, p->replacement, sp, err);
            if (!rc)
                rc = split_piece(&whole, sp, SB_MERGED_NEXT, false, out, err);
        } else if (!rc && whole.len) {
            rc = plist_push(out, whole.s, whole.len, whole.first, err);
        }
        strbuf_free(&c);
        return rc;
    }
    case PT_DIGITS:
        if ((rc = char_spans(pc->s, pc->len, CC_DIGIT, 0, sp, err)))
            return rc;
        return split_piece(pc, sp, p->individual_digits ? SB_ISOLATED : SB_CONTIGUOUS, false, out,
                           err);
    case PT_PUNCTUATION:
        if ((rc = char_spans(pc->s, pc->len, CC_PUNCT, 0, sp, err)))
            return rc;
        return split_piece(pc, sp, p->behavior, false, out, err);
    case PT_WHITESPACE:
        if ((rc = tok_pattern_find(&p->pat, pc->s, pc->len, sp, err)))
            return rc;
        return split_piece(pc, sp, SB_REMOVED, true, out, err);
    case PT_WHITESPACE_SPLIT:
        if ((rc = char_spans(pc->s, pc->len, CC_WHITESPACE, 0, sp, err)))
            return rc;
        return split_piece(pc, sp, SB_REMOVED, false, out, err);
    case PT_CHAR_DELIMITER:
        if ((rc = char_spans(pc->s, pc->len, CC_EQUAL, p->delimiter, sp, err)))
            return rc;
        return split_piece(pc, sp, SB_REMOVED, false, out, err);
    case PT_BERT: {
        struct plist mid = {0};
        rc = char_spans(pc->s, pc->len, CC_WHITESPACE, 0, sp, err);
        if (!rc)
            rc = split_piece(pc, sp, SB_REMOVED, false, &mid, err);
        for (size_t i = 0; !rc && i < mid.n; i++) {
            rc = char_spans(mid.v[i].s, mid.v[i].len, CC_PUNCT, 0, sp, err);
            if (!rc)
                rc = split_piece(&mid.v[i], sp, SB_ISOLATED, false, out, err);
        }
        plist_free(&mid);
        return rc;
    }
    case PT_SEQUENCE:
        break;
    }
    return rc;
}

int pretok_apply(const struct pretok *p, struct plist *l, struct err *err)
{
    if (p->kind == PT_SEQUENCE) {
        for (size_t i = 0; i < p->n_subs; i++) {
            int rc = pretok_apply(p->subs[i], l, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    struct plist out = {0};
    struct spanlist sp = {0};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < l->n; i++)
        rc = apply_one(p, &l->v[i], &out, &sp, err);
    free(sp.v);
    if (rc) {
        plist_free(&out);
        return rc;
    }
    plist_free(l);
    *l = out;
    return 0;
}
