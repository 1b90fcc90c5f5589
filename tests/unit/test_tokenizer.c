/* tests/unit/test_tokenizer.c — tokenizer.json semantics: each component on small hand-written files, bad input, and the real Qwen3/Llama 3/Gemma 3 tokenizers against golden vectors recorded from the Hugging Face reference tokenizers (those skip without INFERD_TOKENIZER_DATA). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "text/tok_internal.h"
#include "text/tokenizer.h"
#include "test_support.h"

/* ---------------------------------------------------------------- helpers */

/* Hand-written tokenizer.json with ` standing for " (keeps the C strings readable). */
static int load_q(const char *q, struct tokenizer **tok, struct err *err)
{
    char *s = strdup(q);
    for (char *p = s; *p; p++)
        if (*p == '`')
            *p = '"';
    int rc = tok_load_json(s, strlen(s), NULL, 0, tok, err);
    free(s);
    return rc;
}

static struct tokenizer *must_load(const char *q)
{
    struct tokenizer *tok = NULL;
    struct err err = {0};
    int rc = load_q(q, &tok, &err);
    cr_assert_eq(rc, 0, "load failed: %s", err.msg);
    return tok;
}

static void expect_ids(const struct tokenizer *tok, const char *text, bool add_special,
                       const int32_t *want, int n_want);

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), (int)(sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t))
#define EXPECT(tok, text, ...) expect_ids((tok), (text), true, IDS(__VA_ARGS__))

static void expect_decode(const struct tokenizer *tok, const int32_t *ids, int n, bool skip,
                          const char *want)
{
    char *text = NULL;
    size_t len = 0;
    struct err err = {0};
    cr_assert_eq(tok_decode(tok, ids, n, skip, &text, &len, &err), 0, "decode: %s", err.msg);
    cr_assert_eq(len, strlen(want), "decoded '%s', want '%s'", text, want);
    cr_assert_str_eq(text, want);
    free(text);
}

static void expect_refused(const char *q, int code, const char *fragment)
{
    struct tokenizer *tok = NULL;
    struct err err = {0};
    int rc = load_q(q, &tok, &err);
    cr_assert_eq(rc, -code, "rc %d, message: %s", rc, err.msg);
    cr_assert_null(tok);
    cr_assert_not_null(strstr(err.msg, fragment), "message '%s' lacks '%s'", err.msg, fragment);
}

/* ---------------------------------------------------------------- BPE model */

#define ABC_VOCAB "{`a`:0,`b`:1,`c`:2,`ab`:3,`abc`:4,`bc`:5,` `:6}"

Test(bpe, pair_merges_apply_in_rank_order)
{
    struct tokenizer *tok = must_load(
        "{`model`:{`type`:`BPE`,`vocab`:" ABC_VOCAB ",`merges`:[[`a`,`b`],[`ab`,`c`]]},"
        "`pre_tokenizer`:{`type`:`WhitespaceSplit`}}");
    EXPECT(tok, "ab c abc cab", 3, 2, 4, 2, 3);
    cr_assert_eq(tok_vocab_size(tok), 7);
    cr_assert_eq(tok_piece_to_id(tok, "abc"), 4);
    cr_assert_eq(tok_piece_to_id(tok, "zz"), -1);
    cr_assert_str_eq(tok_id_to_piece(tok, 5), "bc");
    cr_assert_null(tok_id_to_piece(tok, 7));
    tok_free(tok);
}

Test(bpe, string_merges_equal_pair_merges)
{
    struct tokenizer *tok = must_load(
        "{`model`:{`type`:`BPE`,`vocab`:" ABC_VOCAB ",`merges`:[`a b`,`ab c`]},"
        "`pre_tokenizer`:{`type`:`WhitespaceSplit`}}");
    EXPECT(tok, "ab c abc cab", 3, 2, 4, 2, 3);
    tok_free(tok);
}

Test(bpe, lower_rank_wins_over_leftmost_pair)
{
    /* "b c" (rank 0) beats "a b" (rank 1); then nothing joins a + bc. */
    struct tokenizer *tok = must_load(
        "{`model`:{`type`:`BPE`,`vocab`:" ABC_VOCAB ",`merges`:[`b c`,`a b`]}}");
    EXPECT(tok, "abc", 0, 5);
    EXPECT(tok, "abab", 3, 3);
    tok_free(tok);
}

Test(bpe, long_word_merges_all_pairs)
{
    struct tokenizer *tok = must_load(
        "{`model`:{`type`:`BPE`,`vocab`:{`a`:0,`aa`:1,`aaaa`:2},`merges`:[`a a`,`aa aa`]}}");
    char text[4001];
    memset(text, 'a', 4000);
    text[4000] = 0;
    int32_t *ids = NULL;
    int n = 0;
    struct err err = {0};
    cr_assert_eq(tok_encode(tok, text, 4000, false, &ids, &n, &err), 0);
    cr_assert_eq(n, 1000);
    for (int i = 0; i < n; i++)
        cr_assert_eq(ids[i], 2);
    free(ids);
    EXPECT(tok, "aaaaaaa", 2, 1, 0);
    tok_free(tok);
}

Test(bpe, byte_fallback_emits_byte_tokens_for_unknown_chars)
{
    struct tokenizer *tok = must_load(
        "{`model`:{`type`:`BPE`,`byte_fallback`:true,`unk_token`:`<unk>`,"
        "`vocab`:{`<unk>`:0,`<0xC3>`:1,`<0xA9>`:2,`a`:3},`merges`:[]},"
        "`decoder`:{`type`:`Sequence`,`decoders`:[{`type`:`ByteFallback`},{`type`:`Fuse`}]}}");
    EXPECT(tok, "a\xC3\xA9" "a", 3, 1, 2, 3);
    /* No <0xE4> token: the whole character falls back to unk. */
    EXPECT(tok, "\xE4\xBD\xA0", 0);
    expect_decode(tok, IDS(3, 1, 2, 3), false, "a\xC3\xA9" "a");
    /* An incomplete byte run decodes to one U+FFFD per byte. */
    expect_decode(tok, IDS(3, 1, 3), false, "a\xEF\xBF\xBD" "a");
    tok_free(tok);
}

Test(bpe, unk_is_fused_only_with_fuse_unk)
{
    static const char *fmt = "{`model`:{`type`:`BPE`,`unk_token`:`<unk>`,`fuse_unk`:%s,"
                             "`vocab`:{`<unk>`:0,`a`:1},`merges`:[]}}";
    char q[256];
    snprintf(q, sizeof q, fmt, "true");
    struct tokenizer *tok = must_load(q);
    EXPECT(tok, "xya", 0, 1);
    tok_free(tok);
    snprintf(q, sizeof q, fmt, "false");
    tok = must_load(q);
    EXPECT(tok, "xya", 0, 0, 1);
    tok_free(tok);
    /* Without an unk token, unknown characters are dropped. */
    tok = must_load("{`model`:{`type`:`BPE`,`vocab`:{`a`:0},`merges`:[]}}");
    EXPECT(tok, "xa", 0);
    tok_free(tok);
}

Test(bpe, continuing_subword_prefix_and_end_of_word_suffix)
{
    struct tokenizer *tok = must_load(
        "{`model`:{`type`:`BPE`,`continuing_subword_prefix`:`##`,"
        "`vocab`:{`a`:0,`##b`:1,`ab`:2,`##c`:3},`merges`:[[`a`,`##b`]]}}");
    EXPECT(tok, "abc", 2, 3);
    tok_free(tok);
    tok = must_load("{`model`:{`type`:`BPE`,`end_of_word_suffix`:`</w>`,"
                    "`vocab`:{`a`:0,`b</w>`:1,`ab</w>`:2,`b`:3},`merges`:[[`a`,`b</w>`]]}}");
    EXPECT(tok, "ab", 2);
    EXPECT(tok, "ba", 3);
    tok_free(tok);
}

Test(bpe, ignore_merges_emits_whole_vocab_words)
{
    static const char *fmt = "{`model`:{`type`:`BPE`,`ignore_merges`:%s,"
                             "`vocab`:{`a`:0,`b`:1,`ab`:2,`aab`:3},`merges`:[`a b`]}}";
    char q[256];
    snprintf(q, sizeof q, fmt, "true");
    struct tokenizer *tok = must_load(q);
    EXPECT(tok, "aab", 3);
    tok_free(tok);
    snprintf(q, sizeof q, fmt, "false");
    tok = must_load(q);
    EXPECT(tok, "aab", 0, 2);
    tok_free(tok);
}

/* ---------------------------------------------------------------- pre-tokenizers */

/* Each piece the pre-tokenizer makes is a vocab word (ignore_merges), so ids show the pieces. */
#define PIECES_VOCAB                                                                              \
    "{`a`:0,`b`:1,`c`:2,`-`:3,`--`:4,`a-`:5,`b-`:6,`-b`:7,`-c`:8,`b--`:9,`x`:10}"

static struct tokenizer *split_tok(const char *behavior, const char *invert)
{
    char q[1024];
    snprintf(q, sizeof q,
             "{`model`:{`type`:`BPE`,`ignore_merges`:true,`vocab`:" PIECES_VOCAB ",`merges`:[]},"
             "`pre_tokenizer`:{`type`:`Split`,`pattern`:{`String`:`-`},`behavior`:`%s`,"
             "`invert`:%s}}",
             behavior, invert);
    return must_load(q);
}

Test(pretokenize, split_behaviors_on_a_string_pattern)
{
    struct tokenizer *t;
    t = split_tok("Removed", "false");
    EXPECT(t, "a-b--c", 0, 1, 2);
    tok_free(t);
    t = split_tok("Isolated", "false");
    EXPECT(t, "a-b--c", 0, 3, 1, 3, 3, 2);
    tok_free(t);
    t = split_tok("MergedWithPrevious", "false");
    EXPECT(t, "a-b--c", 5, 6, 3, 2);
    tok_free(t);
    t = split_tok("MergedWithNext", "false");
    EXPECT(t, "a-b--c", 0, 7, 3, 8);
    tok_free(t);
    t = split_tok("Contiguous", "false");
    EXPECT(t, "a-b--c", 0, 3, 1, 4, 2);
    tok_free(t);
    /* invert: the pieces between delimiters are the matches, so Removed keeps only "-". */
    t = split_tok("Removed", "true");
    EXPECT(t, "a-b--c", 3, 3, 3);
    tok_free(t);
}

Test(pretokenize, split_regex_handles_contractions_case_insensitively_and_lookahead)
{
    struct tokenizer *tok = must_load(
        "{`model`:{`type`:`BPE`,`ignore_merges`:true,"
        "`vocab`:{`I`:0,`'LL`:1,` `:2,`  `:3,` go`:4,`'ll`:5,`go`:6},`merges`:[]},"
        "`pre_tokenizer`:{`type`:`Split`,`behavior`:`Isolated`,`invert`:false,`pattern`:{`Regex`:"
        "`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+`}}}");
    /* "   go": \s+(?!\S) leaves the last space to join "go". */
    EXPECT(tok, "I'LL   go", 0, 1, 3, 4);
    EXPECT(tok, "I'll", 0, 5);
    tok_free(tok);
}

Test(pretokenize, regex_whitespace_follows_the_unicode_property_as_oniguruma_does)
{
    /* U+180E has not been White_Space since Unicode 6.3; U+3000 is. */
    struct tokenizer *tok = must_load(
        "{`model`:{`type`:`BPE`,`ignore_merges`:true,"
        "`vocab`:{`a\\u180eb`:0,`a`:1,`b`:2},`merges`:[]},"
        "`pre_tokenizer`:{`type`:`Split`,`pattern`:{`Regex`:`\\\\s+`},`behavior`:`Removed`}}");
    EXPECT(tok, "a\xE1\xA0\x8E" "b", 0);
    EXPECT(tok, "a\xE3\x80\x80" "b", 1, 2);
    tok_free(tok);
}

Test(pretokenize, gpt2_byte_map_is_a_bijection_with_the_known_code_points)
{
    cr_assert_eq(tok_byte_to_cp(' '), 0x120);  /* Ġ */
    cr_assert_eq(tok_byte_to_cp('\n'), 0x10A); /* Ċ */
    cr_assert_eq(tok_byte_to_cp(0x7F), 0x121);
    cr_assert_eq(tok_byte_to_cp(0xAD), 0x143);  /* Ń */
    cr_assert_eq(tok_byte_to_cp('a'), 'a');
    for (int b = 0; b < 256; b++)
        cr_assert_eq(tok_cp_to_byte(tok_byte_to_cp((uint8_t)b)), b, "byte %d", b);
    cr_assert_eq(tok_cp_to_byte(0x20), -1);
    cr_assert_eq(tok_cp_to_byte(0x144), -1);
}

Test(pretokenize, bytelevel_maps_bytes_and_adds_prefix_space)
{
    struct tokenizer *tok = must_load(
        "{`model`:{`type`:`BPE`,`ignore_merges`:true,"
        "`vocab`:{`\\u0120hi`:0,`\\u0120there`:1,`!`:2,`\\u00c3`:3,`\\u00a9`:5,`\\u0120`:4},`merges`:[]},"
        "`pre_tokenizer`:{`type`:`ByteLevel`,`add_prefix_space`:true,`use_regex`:true},"
        "`decoder`:{`type`:`ByteLevel`}}");
    EXPECT(tok, "hi there!", 0, 1, 2);
    EXPECT(tok, "\xC3\xA9", 4, 3, 5);
    expect_decode(tok, IDS(0, 1, 2), false, " hi there!");
    cr_assert_eq(tok_piece_to_id(tok, "\xC4\xA0hi"), 0);
    tok_free(tok);
}

Test(pretokenize, metaspace_prepend_schemes_and_split)
{
    static const char *fmt =
        "{`added_tokens`:[{`id`:5,`content`:`<x>`,`special`:true,`normalized`:false}],"
        "`model`:{`type`:`BPE`,`ignore_merges`:true,"
        "`vocab`:{`\\u2581hi`:0,`\\u2581there`:1,`hi`:2,`\\u2581`:3,`h`:4},`merges`:[]},"
        "`pre_tokenizer`:{`type`:`Metaspace`,`replacement`:`\\u2581`,`prepend_scheme`:`%s`,"
        "`split`:true},`decoder`:{`type`:`Metaspace`,`replacement`:`\\u2581`,"
        "`prepend_scheme`:`%s`}}";
    char q[1024];
    snprintf(q, sizeof q, fmt, "always", "always");
    struct tokenizer *tok = must_load(q);
    EXPECT(tok, "hi there", 0, 1);
    EXPECT(tok, "<x>hi", 5, 0);
    expect_decode(tok, IDS(0, 1), false, "hi there");
    tok_free(tok);
    snprintf(q, sizeof q, fmt, "first", "first");
    tok = must_load(q);
    EXPECT(tok, "hi there", 0, 1);
    EXPECT(tok, "<x>hi", 5, 2);
    tok_free(tok);
    snprintf(q, sizeof q, fmt, "never", "never");
    tok = must_load(q);
    EXPECT(tok, "hi there", 2, 1);
    expect_decode(tok, IDS(0, 1), false, " hi there");
    tok_free(tok);
}

#define CHAR_VOCAB                                                                                \
    "{`a`:0,`1`:1,`2`:2,`3`:3,`123`:4,`!`:5,`?`:6,`hi`:7,`b`:8,`c`:9,`,`:10,`there`:11,`!?`:12}"

static struct tokenizer *pretok_tok(const char *pretok)
{
    char q[1024];
    snprintf(q, sizeof q,
             "{`model`:{`type`:`BPE`,`ignore_merges`:true,`vocab`:" CHAR_VOCAB ",`merges`:[]},"
             "`pre_tokenizer`:%s}",
             pretok);
    return must_load(q);
}

Test(pretokenize, digits_punctuation_whitespace_and_sequence)
{
    struct tokenizer *t = pretok_tok("{`type`:`Digits`,`individual_digits`:true}");
    EXPECT(t, "a123", 0, 1, 2, 3);
    tok_free(t);
    t = pretok_tok("{`type`:`Digits`,`individual_digits`:false}");
    EXPECT(t, "a123", 0, 4);
    tok_free(t);
    t = pretok_tok("{`type`:`Punctuation`,`behavior`:`Isolated`}");
    EXPECT(t, "hi!?", 7, 5, 6);
    tok_free(t);
    t = pretok_tok("{`type`:`WhitespaceSplit`}");
    EXPECT(t, "a  b\tc", 0, 8, 9);
    tok_free(t);
    t = pretok_tok("{`type`:`Whitespace`}");
    EXPECT(t, "hi, there!?", 7, 10, 11, 12);
    tok_free(t);
    t = pretok_tok("{`type`:`Sequence`,`pretokenizers`:[{`type`:`WhitespaceSplit`},"
                   "{`type`:`Digits`,`individual_digits`:true}]}");
    EXPECT(t, "a12 3", 0, 1, 2, 3);
    tok_free(t);
}

/* ---------------------------------------------------------------- normalizers */

static struct tokenizer *norm_tok(const char *norm)
{
    char q[1024];
    snprintf(q, sizeof q,
             "{`model`:{`type`:`BPE`,`ignore_merges`:true,"
             "`vocab`:{`abc`:0,`fi`:1,`e\\u0301`:2,`\\u00e9`:3,`\\u2581a`:4,`a_b`:5,`x`:6,`e`:7},"
             "`merges`:[]},`normalizer`:%s}",
             norm);
    return must_load(q);
}

Test(normalize, unicode_forms_lowercase_replace_prepend_strip)
{
    struct tokenizer *t = norm_tok("{`type`:`Lowercase`}");
    EXPECT(t, "ABC", 0);
    tok_free(t);
    t = norm_tok("{`type`:`NFKC`}");
    EXPECT(t, "\xEF\xAC\x81", 1); /* U+FB01 ligature */
    EXPECT(t, "e\xCC\x81", 3);
    tok_free(t);
    t = norm_tok("{`type`:`NFD`}");
    EXPECT(t, "\xC3\xA9", 2);
    tok_free(t);
    t = norm_tok("{`type`:`Sequence`,`normalizers`:[{`type`:`NFD`},{`type`:`StripAccents`}]}");
    EXPECT(t, "\xC3\xA9", 7);
    tok_free(t);
    t = norm_tok("{`type`:`StripAccents`}"); /* without NFD the precomposed letter stays */
    EXPECT(t, "\xC3\xA9", 3);
    tok_free(t);
    t = norm_tok("{`type`:`NFC`}");
    EXPECT(t, "e\xCC\x81", 3);
    tok_free(t);
    t = norm_tok("{`type`:`Replace`,`pattern`:{`String`:` `},`content`:`_`}");
    EXPECT(t, "a b", 5);
    tok_free(t);
    t = norm_tok("{`type`:`Replace`,`pattern`:{`Regex`:`\\\\s+`},`content`:`_`}");
    EXPECT(t, "a \t b", 5);
    tok_free(t);
    t = norm_tok("{`type`:`Prepend`,`prepend`:`\\u2581`}");
    EXPECT(t, "a", 4);
    tok_free(t);
    t = norm_tok("{`type`:`Sequence`,`normalizers`:[{`type`:`Strip`,`strip_left`:true,"
                 "`strip_right`:true},{`type`:`Lowercase`}]}");
    EXPECT(t, " \t ABC \n", 0);
    tok_free(t);
}

/* ---------------------------------------------------------------- added tokens */

static struct tokenizer *added_tok(const char *flags)
{
    char q[1024];
    snprintf(q, sizeof q,
             "{`added_tokens`:[{`id`:10,`content`:`<m>`,`special`:false,`normalized`:false,%s},"
             "{`id`:11,`content`:`<m>x`,`special`:true,`normalized`:false}],"
             "`model`:{`type`:`BPE`,`ignore_merges`:true,"
             "`vocab`:{`a`:0,`b`:1,` `:2,`a `:3,` b`:4,`ab`:5,`c`:6},`merges`:[]}}",
             flags);
    return must_load(q);
}

Test(added_tokens, leftmost_longest_and_strip_flags)
{
    struct tokenizer *t = added_tok("`lstrip`:false,`rstrip`:false");
    EXPECT(t, "a <m> b", 3, 10, 4);
    EXPECT(t, "a<m>xb", 0, 11, 1); /* the longer <m>x wins */
    cr_assert(tok_is_special(t, 11));
    cr_assert(!tok_is_special(t, 10));
    cr_assert_eq(tok_piece_to_id(t, "<m>x"), 11);
    tok_free(t);
    t = added_tok("`lstrip`:true,`rstrip`:false");
    EXPECT(t, "a <m> b", 0, 10, 4);
    tok_free(t);
    t = added_tok("`lstrip`:false,`rstrip`:true");
    EXPECT(t, "a <m> b", 3, 10, 1);
    tok_free(t);
    t = added_tok("`lstrip`:true,`rstrip`:true");
    EXPECT(t, "a  <m>  b", 0, 10, 1);
    tok_free(t);
}

Test(added_tokens, normalized_tokens_match_after_the_normalizer)
{
    /* Expected ids come from HF tokenizers 0.23.2. */
    struct tokenizer *tok = must_load(
        "{`added_tokens`:[{`id`:5,`content`:`<M>`,`special`:false,`normalized`:true}],"
        "`normalizer`:{`type`:`Lowercase`},`pre_tokenizer`:{`type`:`WhitespaceSplit`},"
        "`model`:{`type`:`BPE`,`vocab`:{`a`:0,`b`:1,`<`:2,`>`:3,`m`:4},`merges`:[]}}");
    EXPECT(tok, "A <M> b", 0, 5, 1);
    EXPECT(tok, "a<m>B", 0, 5, 1);
    EXPECT(tok, "<M", 2, 4);
    tok_free(tok);
}

Test(added_tokens, single_word_matches_only_whole_words)
{
    struct tokenizer *tok = must_load(
        "{`added_tokens`:[{`id`:9,`content`:`ab`,`special`:false,`normalized`:false,"
        "`single_word`:true}],`model`:{`type`:`BPE`,`ignore_merges`:true,"
        "`vocab`:{`a`:0,`b`:1,` `:2,`c`:3,`cab`:4,` cab`:5},`merges`:[]},"
        "`pre_tokenizer`:{`type`:`WhitespaceSplit`}}");
    EXPECT(tok, "ab cab", 9, 4);
    tok_free(tok);
}

Test(added_tokens, skip_special_drops_only_special_tokens)
{
    struct tokenizer *t = added_tok("`lstrip`:false,`rstrip`:false");
    expect_decode(t, IDS(0, 10, 11, 1), true, "a <m> b");
    expect_decode(t, IDS(0, 10, 11, 1), false, "a <m> <m>x b");
    tok_free(t);
}

/* ---------------------------------------------------------------- post-processing */

Test(postprocess, template_adds_bos_and_eos_only_with_add_special)
{
    struct tokenizer *tok = must_load(
        "{`added_tokens`:[{`id`:0,`content`:`<s>`,`special`:true},"
        "{`id`:1,`content`:`</s>`,`special`:true}],"
        "`model`:{`type`:`BPE`,`vocab`:{`<s>`:0,`</s>`:1,`a`:2},`merges`:[]},"
        "`post_processor`:{`type`:`Sequence`,`processors`:[{`type`:`ByteLevel`},"
        "{`type`:`TemplateProcessing`,`single`:[{`SpecialToken`:{`id`:`<s>`,`type_id`:0}},"
        "{`Sequence`:{`id`:`A`,`type_id`:0}},{`SpecialToken`:{`id`:`</s>`,`type_id`:0}}],"
        "`pair`:[],`special_tokens`:{`<s>`:{`id`:`<s>`,`ids`:[0],`tokens`:[`<s>`]},"
        "`</s>`:{`id`:`</s>`,`ids`:[1],`tokens`:[`</s>`]}}}]}}");
    EXPECT(tok, "aa", 0, 2, 2, 1);
    expect_ids(tok, "aa", false, IDS(2, 2));
    EXPECT(tok, "", 0, 1);
    expect_decode(tok, IDS(0, 2, 1), true, "a");
    tok_free(tok);
}

Test(postprocess, bert_processing_wraps_in_cls_and_sep)
{
    struct tokenizer *tok = must_load(
        "{`model`:{`type`:`BPE`,`vocab`:{`[CLS]`:0,`[SEP]`:1,`a`:2},`merges`:[]},"
        "`post_processor`:{`type`:`BertProcessing`,`cls`:[`[CLS]`,0],`sep`:[`[SEP]`,1]}}");
    EXPECT(tok, "a", 0, 2, 1);
    tok_free(tok);
}

/* ---------------------------------------------------------------- decoders */

Test(decoders, replace_bytefallback_fuse_strip_chain)
{
    struct tokenizer *tok = must_load(
        "{`model`:{`type`:`BPE`,`vocab`:{`\\u2581hi`:0,`\\u2581there`:1,`<0xE4>`:2,`<0xBD>`:3,"
        "`<0xA0>`:4},`merges`:[]},"
        "`decoder`:{`type`:`Sequence`,`decoders`:[{`type`:`Replace`,`pattern`:{`String`:"
        "`\\u2581`},`content`:` `},{`type`:`ByteFallback`},{`type`:`Fuse`},"
        "{`type`:`Strip`,`content`:` `,`start`:1,`stop`:0}]}}");
    expect_decode(tok, IDS(0, 1, 2, 3, 4), false, "hi there\xE4\xBD\xA0");
    expect_decode(tok, IDS(2, 3), false, "\xEF\xBF\xBD\xEF\xBF\xBD");
    expect_decode(tok, IDS(0, 99, 1), false, "hi there"); /* unknown ids are dropped */
    tok_free(tok);
}

Test(decoders, strip_counts_and_metaspace_first_token_rule_match_hf)
{
    /* Expected strings come from HF tokenizers 0.23.2. */
    struct tokenizer *tok = must_load(
        "{`model`:{`type`:`BPE`,`vocab`:{`a`:0,`  a  `:1},`merges`:[]},"
        "`decoder`:{`type`:`Strip`,`content`:` `,`start`:1,`stop`:2}}");
    expect_decode(tok, IDS(1, 0), false, " aa");
    expect_decode(tok, IDS(0, 1), false, "a a");
    tok_free(tok);
    /* Metaspace drops every replacement character of the first token, not just a leading one. */
    tok = must_load("{`model`:{`type`:`BPE`,`vocab`:{`\u2581\u2581`:0,`a\u2581b`:1,`\u2581x`:2},"
                    "`merges`:[]},`decoder`:{`type`:`Metaspace`,`replacement`:`\u2581`,"
                    "`prepend_scheme`:`always`,`split`:true}}");
    expect_decode(tok, IDS(0, 2), false, " x");
    expect_decode(tok, IDS(1, 0), false, "ab  ");
    expect_decode(tok, IDS(2, 0), false, "x  ");
    tok_free(tok);
}

Test(decoders, no_decoder_joins_tokens_with_spaces)
{
    struct tokenizer *tok = must_load("{`model`:{`type`:`BPE`,`vocab`:{`a`:0,`b`:1},`merges`:[]}}");
    expect_decode(tok, IDS(0, 1, 0), false, "a b a");
    expect_decode(tok, NULL, 0, false, "");
    tok_free(tok);
}

/* ---------------------------------------------------------------- input text */

Test(encode, invalid_utf8_is_decoded_lossily_first)
{
    struct tokenizer *tok = must_load(
        "{`model`:{`type`:`BPE`,`vocab`:{`a`:0,`\\ufffd`:1,`b`:2},`merges`:[]}}");
    /* FF is one U+FFFD; the truncated E4 BD is one U+FFFD (maximal subpart). */
    expect_ids(tok, "a\xFF" "b\xE4\xBD" "a", true, IDS(0, 1, 2, 1, 0));
    /* A surrogate encoding ED A0 80 is three U+FFFD. */
    expect_ids(tok, "\xED\xA0\x80", true, IDS(1, 1, 1));
    tok_free(tok);
}

/* ---------------------------------------------------------------- bad input */

Test(bad_input, malformed_files_get_clear_errors)
{
    expect_refused("not json", INFERD_EFORMAT, "not valid JSON");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{", INFERD_EFORMAT, "not valid JSON");
    expect_refused("[1,2]", INFERD_EFORMAT, "must be an object");
    expect_refused("{`normalizer`:null}", INFERD_EFORMAT, "no model");
    expect_refused("{`model`:{`type`:`WordPiece`,`vocab`:{}}}", INFERD_EUNSUPPORTED, "WordPiece");
    expect_refused("{`model`:{`type`:`Unigram`,`vocab`:[]}}", INFERD_EUNSUPPORTED, "Unigram");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:[]}}", INFERD_EFORMAT, "vocab");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{`a`:`x`}}}", INFERD_EFORMAT, "integer");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{`a`:-1}}}", INFERD_EFORMAT, "out of range");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{`a`:0},`merges`:{}}}", INFERD_EFORMAT,
                   "merges must be an array");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{`a`:0},`merges`:[`a z`]}}", INFERD_EFORMAT,
                   "not in the vocab");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{`a`:0},`merges`:[`a a`]}}", INFERD_EFORMAT,
                   "not in the vocab");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{`a`:0},`merges`:[`a`]}}", INFERD_EFORMAT,
                   "separated by one space");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{`a`:0},`merges`:[[`a`,1]]}}", INFERD_EFORMAT,
                   "merge 1");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{},`merges`:[]},`normalizer`:{`type`:`Foo`}}",
                   INFERD_EUNSUPPORTED, "normalizer type 'Foo'");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{},`merges`:[]},"
                   "`pre_tokenizer`:{`type`:`UnicodeScripts`}}",
                   INFERD_EUNSUPPORTED, "pre_tokenizer type 'UnicodeScripts'");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{},`merges`:[]},`decoder`:{`type`:`CTC`}}",
                   INFERD_EUNSUPPORTED, "decoder type 'CTC'");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{},`merges`:[]},"
                   "`post_processor`:{`type`:`Bogus`}}",
                   INFERD_EUNSUPPORTED, "post_processor type 'Bogus'");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{},`merges`:[]},`pre_tokenizer`:{`type`:"
                   "`Split`,`pattern`:{`Regex`:`(`},`behavior`:`Isolated`}}",
                   INFERD_EFORMAT, "regex");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{},`merges`:[]},`pre_tokenizer`:{`type`:"
                   "`Split`,`pattern`:{`String`:`x`},`behavior`:`Sideways`}}",
                   INFERD_EUNSUPPORTED, "Sideways");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{},`merges`:[]},`normalizer`:{`type`:7}}",
                   INFERD_EFORMAT, "must be a string");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{},`merges`:[]},`added_tokens`:[{`id`:1}]}",
                   INFERD_EFORMAT, "content");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{},`merges`:[]},`added_tokens`:{}}",
                   INFERD_EFORMAT, "added_tokens must be an array");
    expect_refused("{`model`:{`type`:`BPE`,`vocab`:{},`merges`:[]},`post_processor`:{`type`:"
                   "`TemplateProcessing`,`single`:[{`SpecialToken`:{`id`:`<s>`}}]}}",
                   INFERD_EFORMAT, "has no ids");
}

Test(bad_input, config_file_errors_and_values)
{
    static const char tj[] = "{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}";
    static const char cfg[] = "{\"bos_token\":{\"content\":\"<s>\"},\"eos_token\":\"</s>\","
                              "\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"t\"},"
                              "{\"name\":\"default\",\"template\":\"{{ x }}\"}]}";
    struct tokenizer *tok = NULL;
    struct err err = {0};
    cr_assert_eq(tok_load_json(tj, sizeof tj - 1, cfg, sizeof cfg - 1, &tok, &err), 0, "%s",
                 err.msg);
    cr_assert_str_eq(tok_bos_token(tok), "<s>");
    cr_assert_str_eq(tok_eos_token(tok), "</s>");
    cr_assert_null(tok_pad_token(tok));
    cr_assert_str_eq(tok_chat_template(tok), "{{ x }}");
    tok_free(tok);
    tok = NULL;
    cr_assert_eq(tok_load_json(tj, sizeof tj - 1, "{", 1, &tok, &err), -INFERD_EFORMAT);
    cr_assert_not_null(strstr(err.msg, "tokenizer_config.json"));
    cr_assert_null(tok);
    cr_assert_eq(tok_load("/nonexistent-dir", &tok, &err), -INFERD_EIO, "%s", err.msg);
}

Test(bad_input, load_reads_directory_files)
{
    char *dir = test_mkdtemp();
    char path[1024];
    static const char tj[] = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}";
    static const char sm[] = "{\"eos_token\":\"a\"}";
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    test_write_file(path, tj, sizeof tj - 1);
    snprintf(path, sizeof path, "%s/special_tokens_map.json", dir);
    test_write_file(path, sm, sizeof sm - 1);
    struct tokenizer *tok = NULL;
    struct err err = {0};
    cr_assert_eq(tok_load(dir, &tok, &err), 0, "%s", err.msg);
    cr_assert_str_eq(tok_eos_token(tok), "a");
    cr_assert_null(tok_chat_template(tok));
    tok_free(tok);
    test_rmtree(dir);
    free(dir);
}

/* ---------------------------------------------------------------- real tokenizers */

static struct tokenizer *load_real(const char *name)
{
    const char *root = getenv("INFERD_TOKENIZER_DATA");
    if (!root || !*root) {
        cr_skip_test("INFERD_TOKENIZER_DATA is not set (point it at a directory with %s/tokenizer.json)",
                     name);
        return NULL;
    }
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct stat st;
    if (stat(path, &st) != 0) {
        cr_skip_test("%s is missing; run scripts/fetch-tokenizers.sh", path);
        return NULL;
    }
    struct tokenizer *tok = NULL;
    struct err err = {0};
    int rc = tok_load(dir, &tok, &err);
    cr_assert_eq(rc, 0, "loading %s: %s", dir, err.msg);
    return tok;
}

static void expect_ids(const struct tokenizer *tok, const char *text, bool add_special,
                       const int32_t *want, int n_want)
{
    int32_t *ids = NULL;
    int n = 0;
    struct err err = {0};
    int rc = tok_encode(tok, text, strlen(text), add_special, &ids, &n, &err);
    cr_assert_eq(rc, 0, "encode: %s", err.msg);
    char got[4096] = "";
    for (int i = 0; i < n && strlen(got) < 4000; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%d,", ids[i]);
    cr_assert_eq(n, n_want, "'%s': %d ids, want %d: %s", text, n, n_want, got);
    for (int i = 0; i < n; i++)
        cr_assert_eq(ids[i], want[i], "'%s': id %d is %d, want %d (%s)", text, i, ids[i], want[i],
                     got);
    free(ids);
}

static const char *const round_trip_texts[] = {
    "Hello, my dog is cute",
    " 12345 h\xC3\xA9llo\n\n  w\xC3\xB6rld \xF0\x9F\x99\x82 \xE4\xBD\xA0\xE5\xA5\xBD",
    "I'm sure they'll say \"don't\"; we've    seen it.\r\n\tTabs\tand  spaces  ",
    "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 family, "
    "\xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC \xD0\xA0\xD1\x83\xD1\x81 "
    "\xD8\xA7\xD9\x84\xD8\xB9\xD8\xB1\xD8\xA8\xD9\x8A\xD8\xA9 \xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\x82",
    "x = [1, 22, 333, 4444]; // ?!?! ...",
    "\n",
    " ",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
};

/* decode(encode(t)) == t, and streaming detok of the ids equals the full decode. */
static void check_round_trips(const struct tokenizer *tok)
{
    for (size_t k = 0; k < sizeof round_trip_texts / sizeof *round_trip_texts; k++) {
        const char *text = round_trip_texts[k];
        int32_t *ids = NULL;
        int n = 0;
        struct err err = {0};
        cr_assert_eq(tok_encode(tok, text, strlen(text), false, &ids, &n, &err), 0, "%s", err.msg);
        char *dec = NULL;
        size_t dlen = 0;
        cr_assert_eq(tok_decode(tok, ids, n, false, &dec, &dlen, &err), 0, "%s", err.msg);
        cr_assert_str_eq(dec, text, "round trip of text %zu", k);

        struct detok *d = NULL;
        cr_assert_eq(detok_create(tok, false, &d, &err), 0);
        char *streamed = calloc(1, dlen + 64);
        size_t slen = 0;
        for (int i = 0; i < n; i++) {
            const char *t;
            size_t tl;
            cr_assert_eq(detok_push(d, ids[i], &t, &tl, &err), 0, "%s", err.msg);
            cr_assert(slen + tl <= dlen, "streamed more than the full decode");
            memcpy(streamed + slen, t, tl);
            slen += tl;
            /* Every delta ends on a complete code point. */
            cr_assert(tl == 0 || ((unsigned char)t[tl - 1] & 0xC0) != 0xC0);
        }
        const char *t;
        size_t tl;
        cr_assert_eq(detok_flush(d, &t, &tl, &err), 0);
        memcpy(streamed + slen, t, tl);
        slen += tl;
        cr_assert_eq(slen, dlen, "streamed %zu bytes, full decode %zu (text %zu)", slen, dlen, k);
        cr_assert_eq(memcmp(streamed, dec, dlen), 0, "streamed text differs (text %zu)", k);
        detok_free(d);
        free(streamed);
        free(dec);
        free(ids);
    }
}

/* Streaming arbitrary id sequences (mostly byte tokens from [lo, hi)) gives exactly the full decode. */
static void check_random_id_streams(const struct tokenizer *tok, int32_t lo, int32_t hi)
{
    uint32_t seed = 12345;
    for (int it = 0; it < 400; it++) {
        int32_t ids[40];
        seed = seed * 1103515245u + 12345u;
        int n = (int)((seed >> 16) % 40);
        for (int i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            uint32_t r = seed >> 8;
            ids[i] = r % 3 ? lo + (int32_t)(r % (uint32_t)(hi - lo))
                           : (int32_t)(r % (uint32_t)tok_vocab_size(tok));
        }
        for (int skip = 0; skip < 2; skip++) {
            struct err err = {0};
            char *full = NULL;
            size_t flen = 0;
            cr_assert_eq(tok_decode(tok, ids, n, skip, &full, &flen, &err), 0);
            struct detok *d = NULL;
            cr_assert_eq(detok_create(tok, skip, &d, &err), 0);
            char *acc = malloc(flen + 1);
            size_t alen = 0;
            const char *t;
            size_t tl;
            for (int i = 0; i <= n; i++) {
                if (i < n)
                    cr_assert_eq(detok_push(d, ids[i], &t, &tl, &err), 0);
                else
                    cr_assert_eq(detok_flush(d, &t, &tl, &err), 0);
                cr_assert(alen + tl <= flen, "sequence %d streamed more than the full decode", it);
                memcpy(acc + alen, t, tl);
                alen += tl;
            }
            cr_assert(alen == flen && !memcmp(acc, full, flen),
                      "sequence %d: streamed text differs from the full decode", it);
            free(acc);
            free(full);
            detok_free(d);
        }
    }
}

static const char hello[] = "Hello, my dog is cute";
static const char mixed[] =
    " 12345 h\xC3\xA9llo\n\n  w\xC3\xB6rld \xF0\x9F\x99\x82 \xE4\xBD\xA0\xE5\xA5\xBD";

Test(tokenizer_real, qwen3_matches_reference_ids_and_round_trips)
{
    struct tokenizer *tok = load_real("qwen3");
    cr_assert_eq(tok_vocab_size(tok), 151669);
    static const int32_t a[] = {9707, 11, 847, 5562, 374, 18838};
    expect_ids(tok, hello, true, a, 6);
    static const int32_t b[] = {220, 16,  17,  18,   19,  20,    305, 18503, 385,
                                271, 220, 289, 9416, 507, 27484, 220, 108386};
    expect_ids(tok, mixed, true, b, 17);
    static const char chat[] = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n"
                               "Hello, how are you?<|im_end|>\n<|im_start|>assistant\n";
    static const int32_t c[] = {151644, 8948, 198, 2610,   525, 10950, 13,  151645,
                                198,    151644, 872, 198, 9707, 11,   1246, 525,
                                498,    30,     151645, 198, 151644, 77091, 198};
    expect_ids(tok, chat, false, c, 23);
    static const int32_t d[] = {151667, 6023, 151668};
    expect_ids(tok, "<think>hi</think>", true, d, 3);

    /* skip_special drops <|im_start|>/<|im_end|> but keeps the non-special <think>. */
    static const int32_t e[] = {151644, 872, 198, 151667, 6023, 151668, 151645};
    char *text = NULL;
    struct err err = {0};
    cr_assert_eq(tok_decode(tok, e, 7, true, &text, NULL, &err), 0);
    cr_assert_str_eq(text, "user\n<think>hi</think>");
    free(text);
    cr_assert_str_eq(tok_eos_token(tok), "<|im_end|>");
    cr_assert_not_null(tok_chat_template(tok));
    cr_assert(tok_is_special(tok, 151644));
    cr_assert(!tok_is_special(tok, 151667));
    check_round_trips(tok);
    check_random_id_streams(tok, 0, 256);
    tok_free(tok);
}

Test(tokenizer_real, llama3_matches_reference_ids_and_round_trips)
{
    struct tokenizer *tok = load_real("llama3");
    cr_assert_eq(tok_vocab_size(tok), 128256);
    static const int32_t a[] = {9906, 11, 856, 5679, 374, 19369};
    expect_ids(tok, hello, true, a, 6);
    static const int32_t b[] = {220, 4513, 1774, 305, 19010, 385, 271, 220, 289, 9603, 509, 28584,
                                118195, 53901};
    expect_ids(tok, mixed, true, b, 14);
    static const char chat[] =
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello, how are you?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n";
    static const int32_t c[] = {128000, 128006, 9125, 128007, 271,    2675,   527,   11190, 13,
                                128009, 128006, 882,  128007, 271,    9906,   11,    1268,  527,
                                499,    30,     128009, 128006, 78191, 128007, 271};
    expect_ids(tok, chat, false, c, 25);
    cr_assert_str_eq(tok_bos_token(tok), "<|begin_of_text|>");
    check_round_trips(tok);
    check_random_id_streams(tok, 0, 300);
    tok_free(tok);
}

Test(tokenizer_real, gemma3_matches_reference_ids_and_round_trips)
{
    struct tokenizer *tok = load_real("gemma3");
    cr_assert_eq(tok_vocab_size(tok), 262145);
    static const int32_t a[] = {2, 9259, 236764, 1041, 4799, 563, 12864};
    expect_ids(tok, hello, true, a, 7);
    static const int32_t b[] = {2,   236743, 236770, 236778, 236800, 236812, 236810, 534,   7869,
                                844, 108,    138,    236765, 4010,   671,    57235,  43758, 237389};
    expect_ids(tok, mixed, true, b, 18);
    static const char chat[] = "<bos><start_of_turn>user\nYou are helpful.\n\nHello, how are "
                               "you?<end_of_turn>\n<start_of_turn>model\n";
    static const int32_t c[] = {2,      105, 2364, 107, 3048, 659, 11045, 236761, 108,  9259,
                                236764, 1217, 659, 611, 236881, 106, 107,  105,    4368, 107};
    expect_ids(tok, chat, false, c, 20);
    static const int32_t d[] = {2, 9259, 138, 12392, 108, 26537};
    expect_ids(tok, "Hello  world\n\nfoo", true, d, 6);
    check_round_trips(tok);
    check_random_id_streams(tok, 238, 494); /* <0x00>..<0xFF> */
    tok_free(tok);
}
