/* tests/unit/test_stop.c — stop strings end the stream exactly before them, however the text is split into pieces. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/stop.h"

struct run {
    char out[4096];
    size_t out_len;
    bool stopped;
    int which;
};

/* True when s[0, n) does not end inside a multi-byte sequence. */
static bool ends_on_code_point(const char *s, size_t n)
{
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80)
            continue;
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need <= back;
    }
    return true;
}

/* Streams text cut at cuts[0..n_cuts) (ascending) and collects every emit plus the flush. */
static void stream(const char *const *stops, int n_stops, const char *text, const size_t *cuts,
                   int n_cuts, struct run *r)
{
    struct stop_matcher *m;
    struct err err = {0};
    cr_assert_eq(stop_matcher_create(stops, n_stops, &m, &err), 0, "%s", err.msg);
    size_t len = strlen(text), from = 0;
    r->out_len = 0;
    r->stopped = false;
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        const char *emit;
        size_t emit_len;
        bool stopped;
        cr_assert_eq(stop_matcher_push(m, text + from, to - from, &emit, &emit_len, &stopped, &err),
                     0);
        cr_assert(!r->stopped || emit_len == 0, "emitted after the stop");
        memcpy(r->out + r->out_len, emit, emit_len);
        r->out_len += emit_len;
        cr_assert(ends_on_code_point(r->out, r->out_len), "emit split a code point");
        r->stopped = stopped;
        from = to;
    }
    const char *emit;
    size_t emit_len;
    cr_assert_eq(stop_matcher_flush(m, &emit, &emit_len, &err), 0);
    cr_assert(!r->stopped || emit_len == 0);
    memcpy(r->out + r->out_len, emit, emit_len);
    r->out_len += emit_len;
    r->out[r->out_len] = '\0';
    r->which = stop_matcher_which(m);
    stop_matcher_free(m);
}

/* The non-streaming answer: the stop that completes first (earliest start on a tie) cuts the text. */
static void reference(const char *const *stops, int n_stops, const char *text, struct run *r)
{
    size_t len = strlen(text);
    for (size_t end = 1; end <= len; end++) {
        int best = -1;
        for (int i = 0; i < n_stops; i++) {
            size_t sl = strlen(stops[i]);
            if (sl <= end && memcmp(text + end - sl, stops[i], sl) == 0 &&
                (best < 0 || sl > strlen(stops[best])))
                best = i;
        }
        if (best >= 0) {
            r->out_len = end - strlen(stops[best]);
            memcpy(r->out, text, r->out_len);
            r->out[r->out_len] = '\0';
            r->stopped = true;
            r->which = best;
            return;
        }
    }
    memcpy(r->out, text, len + 1);
    r->out_len = len;
    r->stopped = false;
    r->which = -1;
}

static void expect(const char *const *stops, int n, const char *text, const size_t *cuts,
                   int n_cuts, const char *want, int want_which)
{
    struct run r;
    stream(stops, n, text, cuts, n_cuts, &r);
    cr_assert_str_eq(r.out, want, "text \"%s\" cut %d times", text, n_cuts);
    cr_assert_eq(r.stopped, want_which >= 0);
    cr_assert_eq(r.which, want_which);
}

Test(stop, create_rejects_bad_stop_lists)
{
    struct stop_matcher *m = (struct stop_matcher *)1;
    struct err err = {0};
    const char *empty[] = {""};
    cr_assert_eq(stop_matcher_create(empty, 1, &m, &err), -INFERD_ERANGE);
    cr_assert_null(m);
    char long_stop[STOP_MAX_LEN + 2];
    memset(long_stop, 'x', sizeof long_stop - 1);
    long_stop[sizeof long_stop - 1] = '\0';
    const char *too_long[] = {long_stop};
    cr_assert_eq(stop_matcher_create(too_long, 1, &m, &err), -INFERD_ERANGE);
    long_stop[STOP_MAX_LEN] = '\0';
    cr_assert_eq(stop_matcher_create(too_long, 1, &m, &err), 0, "256 bytes is allowed");
    stop_matcher_free(m);
    const char *many[STOP_MAX_STRINGS + 1];
    for (int i = 0; i <= STOP_MAX_STRINGS; i++)
        many[i] = "x";
    cr_assert_eq(stop_matcher_create(many, STOP_MAX_STRINGS + 1, &m, &err), -INFERD_ERANGE);
    cr_assert_eq(stop_matcher_create(many, -1, &m, &err), -INFERD_ERANGE);
    const char *bad_utf8[] = {"ok", "\xC3"};
    cr_assert_eq(stop_matcher_create(bad_utf8, 2, &m, &err), -INFERD_EINVAL);
    cr_assert(strstr(err.msg, "UTF-8"));
    const char *overlong[] = {"\xC0\xAF"};
    cr_assert_eq(stop_matcher_create(overlong, 1, &m, &err), -INFERD_EINVAL);
    const char *with_null[] = {"a", NULL};
    cr_assert_eq(stop_matcher_create(with_null, 2, &m, &err), -INFERD_EINVAL);
    cr_assert_eq(stop_matcher_create(NULL, 1, &m, &err), -INFERD_EINVAL);
    cr_assert_eq(stop_matcher_create(many, 1, NULL, &err), -INFERD_EINVAL);
}

Test(stop, push_and_flush_reject_null_arguments)
{
    struct stop_matcher *m;
    const char *stops[] = {"x"};
    cr_assert_eq(stop_matcher_create(stops, 1, &m, NULL), 0);
    const char *emit;
    size_t emit_len;
    bool stopped;
    struct err err = {0};
    cr_assert_eq(stop_matcher_push(m, NULL, 3, &emit, &emit_len, &stopped, &err), -INFERD_EINVAL);
    cr_assert_eq(stop_matcher_push(NULL, "a", 1, &emit, &emit_len, &stopped, &err), -INFERD_EINVAL);
    cr_assert_eq(stop_matcher_flush(m, NULL, &emit_len, &err), -INFERD_EINVAL);
    cr_assert_eq(stop_matcher_push(m, NULL, 0, &emit, &emit_len, &stopped, &err), 0);
    cr_assert_eq(emit_len, 0);
    stop_matcher_free(m);
}

Test(stop, stop_in_one_piece_ends_text_before_it)
{
    const char *stops[] = {"STOP"};
    expect(stops, 1, "Hello STOP world", NULL, 0, "Hello ", 0);
}

Test(stop, stop_at_the_very_beginning_emits_nothing)
{
    const char *stops[] = {"STOP"};
    expect(stops, 1, "STOP after", NULL, 0, "", 0);
    size_t cut[] = {2};
    expect(stops, 1, "STOP after", cut, 1, "", 0);
}

Test(stop, stop_split_over_two_pieces_at_every_byte)
{
    const char *stops[] = {"<|im_end|>"};
    const char *text = "answer: 42<|im_end|>trailing junk";
    for (size_t c = 0; c <= strlen(text); c++)
        expect(stops, 1, text, &c, 1, "answer: 42", 0);
}

Test(stop, stop_split_over_three_to_five_pieces_at_every_position)
{
    const char *stops[] = {"END", "</s>"};
    const char *text = "ab</s>xEND";
    size_t len = strlen(text);
    int combos = 0;
    for (size_t a = 0; a <= len; a++)
        for (size_t b = a; b <= len; b++)
            for (size_t c = b; c <= len; c++)
                for (size_t d = c; d <= len; d++) {
                    size_t cuts[] = {a, b, c, d};
                    for (int n = 2; n <= 4; n++)
                        expect(stops, 2, text, cuts, n, "ab", 1);
                    combos++;
                }
    cr_assert_gt(combos, 1000);
}

Test(stop, stop_split_inside_a_multibyte_character)
{
    const char *stops[] = {"→ÉND", "日本"};
    const char *text = "naïve → ok→ÉND日本";
    for (size_t c = 0; c <= strlen(text); c++)
        for (size_t d = c; d <= strlen(text); d++) {
            size_t cuts[] = {c, d};
            expect(stops, 2, text, cuts, 2, "naïve → ok", 0);
        }
}

Test(stop, held_tail_never_ends_inside_a_code_point)
{
    /* The stop's prefix "é" is one code point; a lone first byte of it must not be emitted. */
    struct stop_matcher *m;
    const char *stops[] = {"éX"};
    cr_assert_eq(stop_matcher_create(stops, 1, &m, NULL), 0);
    const char *emit;
    size_t emit_len;
    bool stopped;
    cr_assert_eq(stop_matcher_push(m, "ab\xC3", 3, &emit, &emit_len, &stopped, NULL), 0);
    cr_assert_eq(emit_len, 2);
    cr_assert_eq(stop_matcher_push(m, "\xA9Y", 2, &emit, &emit_len, &stopped, NULL), 0);
    cr_assert_eq(emit_len, 3);
    cr_assert_eq(memcmp(emit, "éY", 3), 0);
    cr_assert_not(stopped);
    stop_matcher_free(m);
}

Test(stop, possible_stop_prefix_is_held_then_released)
{
    struct stop_matcher *m;
    const char *stops[] = {"lol"};
    cr_assert_eq(stop_matcher_create(stops, 1, &m, NULL), 0);
    const char *emit;
    size_t emit_len;
    bool stopped;
    cr_assert_eq(stop_matcher_push(m, "Hello", 5, &emit, &emit_len, &stopped, NULL), 0);
    cr_assert_eq(emit_len, 3, "\"lo\" could still become \"lol\"");
    cr_assert_eq(stop_matcher_push(m, "x", 1, &emit, &emit_len, &stopped, NULL), 0);
    cr_assert_eq(emit_len, 3);
    cr_assert_eq(memcmp(emit, "lox", 3), 0);
    cr_assert_eq(stop_matcher_push(m, "lo", 2, &emit, &emit_len, &stopped, NULL), 0);
    cr_assert_eq(emit_len, 0);
    cr_assert_eq(stop_matcher_push(m, "l", 1, &emit, &emit_len, &stopped, NULL), 0);
    cr_assert(stopped);
    cr_assert_eq(emit_len, 0);
    stop_matcher_free(m);
}

Test(stop, overlapping_stops_completing_together_pick_the_earlier_start)
{
    const char *ab_b[] = {"ab", "b"};
    const char *b_ab[] = {"b", "ab"};
    expect(ab_b, 2, "xab", NULL, 0, "x", 0);
    expect(b_ab, 2, "xab", NULL, 0, "x", 1);
    size_t cut = 2;
    expect(ab_b, 2, "xab", &cut, 1, "x", 0);
    expect(ab_b, 2, "xbab", NULL, 0, "x", 1);
}

Test(stop, stop_that_is_a_prefix_of_a_longer_one_completes_first)
{
    const char *stops[] = {"abc", "ab"};
    expect(stops, 2, "zabcd", NULL, 0, "z", 1);
    /* "xabc" starts first but "bcd" has not completed when "xabc" does. */
    const char *later[] = {"bcd", "xabc"};
    expect(later, 2, "xabcd", NULL, 0, "", 1);
    const char *inner[] = {"xabcd", "bc"};
    expect(inner, 2, "xabcd", NULL, 0, "xa", 1);
}

Test(stop, near_match_that_diverges_is_emitted_unchanged)
{
    const char *stops[] = {"<|end|>"};
    const char *text = "a <|en d|> b <|end <|e|> <|end|";
    for (size_t c = 0; c <= strlen(text); c++)
        expect(stops, 1, text, &c, 1, text, -1);
}

Test(stop, flush_without_stop_returns_the_held_tail)
{
    struct stop_matcher *m;
    const char *stops[] = {"STOP"};
    cr_assert_eq(stop_matcher_create(stops, 1, &m, NULL), 0);
    const char *emit;
    size_t emit_len;
    bool stopped;
    cr_assert_eq(stop_matcher_push(m, "all ST", 6, &emit, &emit_len, &stopped, NULL), 0);
    cr_assert_eq(emit_len, 4);
    cr_assert_eq(stop_matcher_flush(m, &emit, &emit_len, NULL), 0);
    cr_assert_eq(emit_len, 2);
    cr_assert_eq(memcmp(emit, "ST", 2), 0);
    cr_assert_eq(stop_matcher_flush(m, &emit, &emit_len, NULL), 0);
    cr_assert_eq(emit_len, 0);
    cr_assert_eq(stop_matcher_which(m), -1);
    stop_matcher_free(m);
}

Test(stop, pushes_after_the_stop_emit_nothing)
{
    struct stop_matcher *m;
    const char *stops[] = {"X"};
    cr_assert_eq(stop_matcher_create(stops, 1, &m, NULL), 0);
    const char *emit;
    size_t emit_len;
    bool stopped;
    cr_assert_eq(stop_matcher_push(m, "aXb", 3, &emit, &emit_len, &stopped, NULL), 0);
    cr_assert(stopped);
    cr_assert_eq(emit_len, 1);
    cr_assert_eq(stop_matcher_push(m, "more", 4, &emit, &emit_len, &stopped, NULL), 0);
    cr_assert(stopped);
    cr_assert_eq(emit_len, 0);
    cr_assert_eq(stop_matcher_flush(m, &emit, &emit_len, NULL), 0);
    cr_assert_eq(emit_len, 0);
    stop_matcher_free(m);
}

Test(stop, no_stops_passes_text_through)
{
    expect(NULL, 0, "anything at all", NULL, 0, "anything at all", -1);
}

Test(stop, one_megabyte_in_one_byte_pieces_with_adversarial_stops)
{
    /* Every stop is 255 'a's and then another byte, and the text is all 'a's: a
     * rescanning matcher would do ~n * 16 * 255^2 work here; the automata do ~n * 16. */
    char stop_buf[STOP_MAX_STRINGS][STOP_MAX_LEN + 1];
    const char *stops[STOP_MAX_STRINGS];
    for (int i = 0; i < STOP_MAX_STRINGS; i++) {
        memset(stop_buf[i], 'a', STOP_MAX_LEN - 1);
        stop_buf[i][STOP_MAX_LEN - 1] = (char)('b' + i);
        stop_buf[i][STOP_MAX_LEN] = '\0';
        stops[i] = stop_buf[i];
    }
    struct stop_matcher *m;
    cr_assert_eq(stop_matcher_create(stops, STOP_MAX_STRINGS, &m, NULL), 0);
    size_t total = 0;
    const char *emit;
    size_t emit_len;
    bool stopped = false;
    const size_t n = 1 << 20;
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(stop_matcher_push(m, "a", 1, &emit, &emit_len, &stopped, NULL), 0);
        total += emit_len;
    }
    cr_assert_not(stopped);
    cr_assert_eq(total, n - (STOP_MAX_LEN - 1), "only a possible stop prefix is held");
    cr_assert_eq(stop_matcher_push(m, "c", 1, &emit, &emit_len, &stopped, NULL), 0);
    cr_assert(stopped);
    cr_assert_eq(stop_matcher_which(m), 1);
    cr_assert_eq(total + emit_len, n - (STOP_MAX_LEN - 1));
    stop_matcher_free(m);
}

Test(stop, random_texts_and_splits_match_the_whole_text_answer)
{
    static const char *const atoms[] = {"a", "b", "c", "é", "→", "😀"};
    const int n_atoms = sizeof atoms / sizeof atoms[0];
    srand(12345);
    for (int iter = 0; iter < 3000; iter++) {
        char stop_buf[4][32];
        const char *stops[4];
        int n_stops = 1 + rand() % 4;
        for (int s = 0; s < n_stops; s++) {
            stop_buf[s][0] = '\0';
            for (int k = 1 + rand() % 4; k > 0; k--)
                strcat(stop_buf[s], atoms[rand() % n_atoms]);
            stops[s] = stop_buf[s];
        }
        char text[512] = "";
        for (int k = rand() % 60; k > 0; k--)
            strcat(text, atoms[rand() % n_atoms]);
        size_t len = strlen(text);
        size_t cuts[12];
        int n_cuts = rand() % 12;
        for (int i = 0; i < n_cuts; i++)
            cuts[i] = len ? (size_t)rand() % (len + 1) : 0;
        for (int i = 1; i < n_cuts; i++)
            for (int j = i; j > 0 && cuts[j - 1] > cuts[j]; j--) {
                size_t t = cuts[j];
                cuts[j] = cuts[j - 1];
                cuts[j - 1] = t;
            }
        struct run got, want;
        stream(stops, n_stops, text, cuts, n_cuts, &got);
        reference(stops, n_stops, text, &want);
        cr_assert_str_eq(got.out, want.out, "iteration %d, text \"%s\"", iter, text);
        cr_assert_eq(got.stopped, want.stopped);
        cr_assert_eq(got.which, want.which);
    }
}
