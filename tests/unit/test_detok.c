/* tests/unit/test_detok.c — streaming detokenizer: complete UTF-8 only, and the pieces add up to the full decode. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

static struct tokenizer *load_q(const char *q)
{
    char *s = strdup(q);
    for (char *p = s; *p; p++)
        if (*p == '`')
            *p = '"';
    struct tokenizer *tok = NULL;
    struct err err = {0};
    int rc = tok_load_json(s, strlen(s), NULL, 0, &tok, &err);
    free(s);
    cr_assert_eq(rc, 0, "load: %s", err.msg);
    return tok;
}

/* Byte-level vocab: the three bytes of U+4F60 as separate tokens, plus words. */
static const char bytelevel_json[] =
    "{`added_tokens`:[{`id`:9,`content`:`<eos>`,`special`:true,`normalized`:false}],"
    "`model`:{`type`:`BPE`,`vocab`:{`\\u00e4`:0,`\\u00bd`:1,`\\u0142`:2,`hi`:3,`\\u0120there`:4,"
    "`\\u00ef\\u00bf\\u00bd`:5},`merges`:[]},"
    "`pre_tokenizer`:{`type`:`ByteLevel`,`add_prefix_space`:false,`use_regex`:true},"
    "`decoder`:{`type`:`ByteLevel`}}";

/* SentencePiece style: Metaspace-like Replace, byte fallback, Fuse. */
static const char fallback_json[] =
    "{`model`:{`type`:`BPE`,`byte_fallback`:true,`vocab`:{`\\u2581hi`:0,`\\u2581there`:1,"
    "`<0xE4>`:2,`<0xBD>`:3,`<0xA0>`:4},`merges`:[]},"
    "`decoder`:{`type`:`Sequence`,`decoders`:[{`type`:`Replace`,`pattern`:{`String`:"
    "`\\u2581`},`content`:` `},{`type`:`ByteFallback`},{`type`:`Fuse`}]}}";

static const char metaspace_json[] =
    "{`model`:{`type`:`BPE`,`vocab`:{`\\u2581hi`:0,`\\u2581there`:1,`!`:2},`merges`:[]},"
    "`decoder`:{`type`:`Metaspace`,`replacement`:`\\u2581`,`prepend_scheme`:`always`}}";

/* Pushes ids, checks each delta against want[i], then the flush against want[n]. */
static void expect_stream(const struct tokenizer *tok, bool skip, const int32_t *ids, int n,
                          const char *const *want)
{
    struct detok *d = NULL;
    struct err err = {0};
    cr_assert_eq(detok_create(tok, skip, &d, &err), 0);
    char all[256] = "";
    const char *t;
    size_t len;
    for (int i = 0; i < n; i++) {
        cr_assert_eq(detok_push(d, ids[i], &t, &len, &err), 0, "%s", err.msg);
        cr_assert_eq(len, strlen(t));
        cr_assert_str_eq(t, want[i], "after id %d (#%d): '%s', want '%s'", ids[i], i, t, want[i]);
        strcat(all, t);
    }
    cr_assert_eq(detok_flush(d, &t, &len, &err), 0);
    cr_assert_str_eq(t, want[n], "flush: '%s', want '%s'", t, want[n]);
    strcat(all, t);
    char *full = NULL;
    cr_assert_eq(tok_decode(tok, ids, n, skip, &full, NULL, &err), 0);
    cr_assert_str_eq(all, full, "streamed '%s' != decoded '%s'", all, full);
    free(full);
    detok_free(d);
}

Test(detok, bytelevel_holds_partial_character_until_complete)
{
    struct tokenizer *tok = load_q(bytelevel_json);
    /* U+4F60 = E4 BD A0; byte A0 maps to U+0142 in the GPT-2 byte map. */
    static const int32_t ids[] = {3, 0, 1, 2, 4};
    static const char *const want[] = {"hi", "", "", "\xE4\xBD\xA0", " there", ""};
    expect_stream(tok, false, ids, 5, want);
    tok_free(tok);
}

Test(detok, incomplete_sequence_comes_out_as_replacement_at_flush)
{
    struct tokenizer *tok = load_q(bytelevel_json);
    static const int32_t ids[] = {3, 0, 1};
    static const char *const want[] = {"hi", "", "", "\xEF\xBF\xBD"};
    expect_stream(tok, false, ids, 3, want);
    tok_free(tok);
}

Test(detok, broken_sequence_followed_by_text_is_one_replacement_then_text)
{
    struct tokenizer *tok = load_q(bytelevel_json);
    static const int32_t ids[] = {0, 3};
    static const char *const want[] = {"", "\xEF\xBF\xBDhi", ""};
    expect_stream(tok, false, ids, 2, want);
    tok_free(tok);
}

Test(detok, real_replacement_character_token_is_emitted_once_confirmed)
{
    struct tokenizer *tok = load_q(bytelevel_json);
    static const int32_t ids[] = {5, 3};
    static const char *const want[] = {"", "\xEF\xBF\xBDhi", ""};
    expect_stream(tok, false, ids, 2, want);
    tok_free(tok);
}

Test(detok, skip_special_drops_special_tokens)
{
    struct tokenizer *tok = load_q(bytelevel_json);
    static const int32_t ids[] = {3, 9, 4};
    static const char *const want[] = {"hi", "", " there", ""};
    expect_stream(tok, true, ids, 3, want);
    static const char *const want_kept[] = {"hi", "<eos>", " there", ""};
    expect_stream(tok, false, ids, 3, want_kept);
    tok_free(tok);
}

Test(detok, byte_fallback_run_comes_out_when_the_run_ends)
{
    struct tokenizer *tok = load_q(fallback_json);
    static const int32_t ids[] = {0, 2, 3, 4, 1};
    static const char *const want[] = {" hi", "", "", "", "\xE4\xBD\xA0 there", ""};
    expect_stream(tok, false, ids, 5, want);
    tok_free(tok);
}

Test(detok, byte_fallback_run_that_turns_invalid_becomes_replacements)
{
    /* E4 BD A0 is complete, but ByteFallback judges the run E4 BD A0 BD as a whole. */
    struct tokenizer *tok = load_q(fallback_json);
    static const int32_t ids[] = {2, 3, 4, 3, 0};
    static const char *const want[] = {
        "", "", "", "", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD hi", ""};
    expect_stream(tok, false, ids, 5, want);
    tok_free(tok);
}

Test(detok, consecutive_byte_fallback_characters_come_out_whole)
{
    struct tokenizer *tok = load_q(fallback_json);
    static const int32_t ids[] = {2, 3, 4, 2, 3, 4, 0, 2, 3, 4};
    static const char *const want[] = {"", "", "", "", "", "", "\xE4\xBD\xA0\xE4\xBD\xA0 hi",
                                       "", "", "", "\xE4\xBD\xA0"};
    expect_stream(tok, false, ids, 10, want);
    tok_free(tok);
}

Test(detok, metaspace_strips_only_the_first_space)
{
    struct tokenizer *tok = load_q(metaspace_json);
    static const int32_t ids[] = {0, 1, 2, 1};
    static const char *const want[] = {"hi", " there", "!", " there", ""};
    expect_stream(tok, false, ids, 4, want);
    tok_free(tok);
}

Test(detok, flush_resets_for_a_new_sequence)
{
    struct tokenizer *tok = load_q(metaspace_json);
    struct detok *d = NULL;
    struct err err = {0};
    const char *t;
    size_t len;
    cr_assert_eq(detok_create(tok, false, &d, &err), 0);
    cr_assert_eq(detok_push(d, 0, &t, &len, &err), 0);
    cr_assert_str_eq(t, "hi");
    cr_assert_eq(detok_flush(d, &t, &len, &err), 0);
    cr_assert_eq(len, 0);
    cr_assert_eq(detok_push(d, 1, &t, &len, &err), 0);
    cr_assert_str_eq(t, "there");
    detok_free(d);
    tok_free(tok);
}
