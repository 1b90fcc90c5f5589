/* tests/unit/test_reasoning.c — <think> text becomes reasoning, the rest content, however the stream is split. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "text/reasoning.h"

struct split {
    char reasoning[2048];
    size_t reasoning_len;
    char content[2048];
    size_t content_len;
};

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

static void collect(struct split *s, const struct reasoning_delta *d)
{
    memcpy(s->reasoning + s->reasoning_len, d->reasoning, d->reasoning_len);
    s->reasoning_len += d->reasoning_len;
    s->reasoning[s->reasoning_len] = '\0';
    memcpy(s->content + s->content_len, d->content, d->content_len);
    s->content_len += d->content_len;
    s->content[s->content_len] = '\0';
    cr_assert(ends_on_code_point(s->reasoning, s->reasoning_len), "reasoning split a code point");
    cr_assert(ends_on_code_point(s->content, s->content_len), "content split a code point");
}

/* Streams text cut at ascending cuts[0..n_cuts), then flushes. */
static void stream(const struct reasoning_opts *opts, const char *text, const size_t *cuts,
                   int n_cuts, struct split *s)
{
    struct reasoning_splitter *r;
    struct err err = {0};
    cr_assert_eq(reasoning_splitter_create(opts, &r, &err), 0, "%s", err.msg);
    memset(s, 0, sizeof *s);
    size_t len = strlen(text), from = 0;
    struct reasoning_delta d;
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        cr_assert_eq(reasoning_splitter_push(r, text + from, to - from, &d, &err), 0);
        collect(s, &d);
        from = to;
    }
    cr_assert_eq(reasoning_splitter_flush(r, &d, &err), 0);
    collect(s, &d);
    reasoning_splitter_free(r);
}

static void expect_all_splits(bool starts_inside, const char *text, const char *want_reasoning,
                              const char *want_content)
{
    struct reasoning_opts opts = {.starts_inside = starts_inside};
    struct split s;
    size_t len = strlen(text);
    for (size_t a = 0; a <= len; a++)
        for (size_t b = a; b <= len; b++) {
            size_t cuts[] = {a, b};
            stream(&opts, text, cuts, 2, &s);
            cr_assert_str_eq(s.reasoning, want_reasoning, "cuts %zu,%zu of \"%s\"", a, b, text);
            cr_assert_str_eq(s.content, want_content, "cuts %zu,%zu of \"%s\"", a, b, text);
        }
    char *reasoning, *content;
    size_t rl, cl;
    cr_assert_eq(reasoning_split_all(text, len, starts_inside, &reasoning, &rl, &content, &cl, NULL),
                 0);
    cr_assert_str_eq(reasoning, want_reasoning);
    cr_assert_str_eq(content, want_content);
    cr_assert_eq(rl, strlen(want_reasoning));
    cr_assert_eq(cl, strlen(want_content));
    free(reasoning);
    free(content);
}

Test(reasoning, whole_text_in_one_piece_splits_at_the_tags)
{
    struct split s;
    stream(NULL, "<think>plan it</think>the answer", NULL, 0, &s);
    cr_assert_str_eq(s.reasoning, "plan it");
    cr_assert_str_eq(s.content, "the answer");
}

Test(reasoning, tags_split_at_every_byte_are_recognised_and_newlines_kept)
{
    expect_all_splits(false, "<think>\nstep 1\n</think>\n\nAnswer.", "\nstep 1\n", "\n\nAnswer.");
}

Test(reasoning, one_byte_pieces)
{
    const char *text = "pre<think>a<b</thin</think>post";
    size_t cuts[64];
    int n = 0;
    for (size_t i = 1; i < strlen(text); i++)
        cuts[n++] = i;
    struct split s;
    stream(NULL, text, cuts, n, &s);
    cr_assert_str_eq(s.reasoning, "a<b</thin");
    cr_assert_str_eq(s.content, "prepost");
}

Test(reasoning, starts_inside_is_reasoning_until_the_end_tag)
{
    expect_all_splits(true, "\nLet me think.\n</think>\n\nHi!", "\nLet me think.\n", "\n\nHi!");
}

Test(reasoning, no_tags_is_all_content)
{
    expect_all_splits(false, "just an answer, no < think > here", "",
                      "just an answer, no < think > here");
}

Test(reasoning, unclosed_think_stays_reasoning)
{
    expect_all_splits(false, "Hi <think>still going", "still going", "Hi ");
}

Test(reasoning, partial_tag_at_end_is_flushed_where_the_text_is)
{
    expect_all_splits(false, "answer <thi", "", "answer <thi");
    expect_all_splits(false, "<think>plan</thi", "plan</thi", "");
    expect_all_splits(true, "plan <", "plan <", "");
}

Test(reasoning, partial_tag_is_held_back_until_decided)
{
    struct reasoning_splitter *r;
    cr_assert_eq(reasoning_splitter_create(NULL, &r, NULL), 0);
    struct reasoning_delta d;
    cr_assert_eq(reasoning_splitter_push(r, "ok <thi", 7, &d, NULL), 0);
    cr_assert_eq(d.content_len, 3);
    cr_assert_eq(d.reasoning_len, 0);
    cr_assert_not(reasoning_splitter_inside(r));
    cr_assert_eq(reasoning_splitter_push(r, "nk>x", 4, &d, NULL), 0);
    cr_assert_eq(d.content_len, 0);
    cr_assert_eq(d.reasoning_len, 1);
    cr_assert_eq(d.reasoning[0], 'x');
    cr_assert(reasoning_splitter_inside(r));
    reasoning_splitter_free(r);
}

Test(reasoning, second_think_goes_to_reasoning_again)
{
    expect_all_splits(false, "<think>a</think>b<think>c</think>d", "ac", "bd");
}

Test(reasoning, multibyte_text_around_tags_split_inside_characters)
{
    expect_all_splits(false, "é<think>→ü😀</think>日本", "→ü😀", "é日本");
    expect_all_splits(true, "日</think>本", "日", "本");
}

Test(reasoning, custom_tags)
{
    struct reasoning_opts opts = {.start_tag = "<|begin_of_thought|>",
                                  .end_tag = "<|end_of_thought|>"};
    const char *text = "<|begin_of_thought|>hmm <think><|end_of_thought|>done";
    for (size_t c = 0; c <= strlen(text); c++) {
        struct split s;
        stream(&opts, text, &c, 1, &s);
        cr_assert_str_eq(s.reasoning, "hmm <think>");
        cr_assert_str_eq(s.content, "done");
    }
}

Test(reasoning, bad_tags_and_null_arguments_are_rejected)
{
    struct reasoning_splitter *r = (struct reasoning_splitter *)1;
    struct err err = {0};
    struct reasoning_opts empty = {.start_tag = ""};
    cr_assert_eq(reasoning_splitter_create(&empty, &r, &err), -INFERD_ERANGE);
    cr_assert_null(r);
    cr_assert(strstr(err.msg, "start tag"));
    char long_tag[REASONING_TAG_MAX + 2];
    memset(long_tag, 'x', sizeof long_tag - 1);
    long_tag[sizeof long_tag - 1] = '\0';
    struct reasoning_opts too_long = {.end_tag = long_tag};
    cr_assert_eq(reasoning_splitter_create(&too_long, &r, &err), -INFERD_ERANGE);
    cr_assert(strstr(err.msg, "end tag"));
    cr_assert_eq(reasoning_splitter_create(NULL, NULL, &err), -INFERD_EINVAL);
    cr_assert_eq(reasoning_splitter_create(NULL, &r, &err), 0);
    struct reasoning_delta d;
    cr_assert_eq(reasoning_splitter_push(r, NULL, 1, &d, &err), -INFERD_EINVAL);
    cr_assert_eq(reasoning_splitter_push(r, "x", 1, NULL, &err), -INFERD_EINVAL);
    cr_assert_eq(reasoning_splitter_flush(r, NULL, &err), -INFERD_EINVAL);
    reasoning_splitter_free(r);
    char *a, *b;
    cr_assert_eq(reasoning_split_all(NULL, 1, false, &a, NULL, &b, NULL, &err), -INFERD_EINVAL);
}

Test(reasoning, random_texts_and_splits_match_split_all)
{
    static const char *const atoms[] = {"<think>", "</think>", "<", "</", "<th", "think", ">",
                                        "\n", "a", "é", "→", "😀", "</think"};
    const int n_atoms = sizeof atoms / sizeof atoms[0];
    srand(777);
    for (int iter = 0; iter < 3000; iter++) {
        char text[1024] = "";
        for (int k = rand() % 40; k > 0; k--)
            strcat(text, atoms[rand() % n_atoms]);
        size_t len = strlen(text);
        size_t cuts[16];
        int n_cuts = rand() % 16;
        for (int i = 0; i < n_cuts; i++)
            cuts[i] = (size_t)rand() % (len + 1);
        for (int i = 1; i < n_cuts; i++)
            for (int j = i; j > 0 && cuts[j - 1] > cuts[j]; j--) {
                size_t t = cuts[j];
                cuts[j] = cuts[j - 1];
                cuts[j - 1] = t;
            }
        struct reasoning_opts opts = {.starts_inside = rand() % 2};
        struct split s;
        stream(&opts, text, cuts, n_cuts, &s);
        char *reasoning, *content;
        size_t rl, cl;
        cr_assert_eq(reasoning_split_all(text, len, opts.starts_inside, &reasoning, &rl, &content,
                                         &cl, NULL),
                     0);
        cr_assert_str_eq(s.reasoning, reasoning, "iteration %d, text \"%s\"", iter, text);
        cr_assert_str_eq(s.content, content, "iteration %d, text \"%s\"", iter, text);
        free(reasoning);
        free(content);
    }
}
