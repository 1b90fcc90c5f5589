/* fuzz/fuzz_websocket.c — libFuzzer target: WebSocket client frames on arbitrary bytes, fed to
 * the reader in pieces whose sizes the input's first byte picks; every event must lie within
 * the limits, and the same bytes fed whole must give the same events. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/websocket.h"
#include "base/utf8.h"

#define MAX_MESSAGE 4096
#define MAX_EVENTS 256

struct trace {
    int kinds[MAX_EVENTS];
    size_t lens[MAX_EVENTS];
    uint64_t sums[MAX_EVENTS];
    int n;
    int error;
};

static void record(struct trace *t, const struct ws_event *ev)
{
    if (ev->kind == WS_EVENT_MESSAGE && ev->len > MAX_MESSAGE)
        __builtin_trap();
    if ((ev->kind == WS_EVENT_PING || ev->kind == WS_EVENT_PONG) && ev->len > 125)
        __builtin_trap();
    if (ev->kind == WS_EVENT_MESSAGE && ev->text && !utf8_valid(ev->data, ev->len))
        __builtin_trap();
    uint64_t sum = 0;
    for (size_t i = 0; i < ev->len; i++)
        sum = sum * 31 + ev->data[i];
    if (t->n < MAX_EVENTS) {
        t->kinds[t->n] = ev->kind;
        t->lens[t->n] = ev->len;
        t->sums[t->n] = sum;
    }
    t->n++;
}

/* Feeds data in pieces of step bytes (0: all at once), draining events after each. */
static void run(const uint8_t *data, size_t size, size_t step, struct trace *t)
{
    struct ws_reader r = {.max_message = MAX_MESSAGE};
    memset(t, 0, sizeof *t);
    size_t at = 0;
    while (at < size && !t->error) {
        size_t n = step && size - at > step ? step : size - at;
        if (!ws_reader_feed(&r, data + at, n))
            break;
        at += n;
        for (;;) {
            struct ws_event ev;
            struct err err = {0};
            if (ws_reader_next(&r, &ev, &err) < 0) {
                if (ev.close_code != WS_CLOSE_PROTOCOL && ev.close_code != WS_CLOSE_BAD_DATA &&
                    ev.close_code != WS_CLOSE_TOO_BIG)
                    __builtin_trap();
                if (!memchr(err.msg, '\0', sizeof err.msg) || err.msg[0] == '\0')
                    __builtin_trap();
                t->error = ev.close_code;
                break;
            }
            if (ev.kind == WS_EVENT_NONE)
                break;
            record(t, &ev);
            if (ev.kind == WS_EVENT_CLOSE)
                goto out;
        }
    }
out:
    ws_reader_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t step = 1 + data[0] % 17;
    /* The reader unmasks in place: each run gets its own copy. */
    uint8_t *a = malloc(size), *b = malloc(size);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memcpy(a, data + 1, size - 1);
    memcpy(b, data + 1, size - 1);
    static struct trace whole, pieces;
    run(a, size - 1, 0, &whole);
    run(b, size - 1, step, &pieces);
    if (whole.n != pieces.n || whole.error != pieces.error)
        __builtin_trap();
    for (int i = 0; i < whole.n && i < MAX_EVENTS; i++)
        if (whole.kinds[i] != pieces.kinds[i] || whole.lens[i] != pieces.lens[i] ||
            whole.sums[i] != pieces.sums[i])
            __builtin_trap();

    /* Server frames read back as client frames once masked: lengths in every form. */
    struct strbuf out = {0};
    size_t len = size - 1 < 70000 ? size - 1 : 70000;
    if (ws_frame_write(&out, WS_OP_BINARY, data + 1, len)) {
        size_t hl = out.len - len;
        uint8_t *m = malloc(out.len + 4);
        if (m) {
            memcpy(m, out.data, hl);
            m[1] |= 0x80;
            memcpy(m + hl, "\0\0\0\0", 4); /* a zero mask */
            memcpy(m + hl + 4, data + 1, len);
            struct ws_frame f;
            size_t used;
            struct err err = {0};
            if (ws_frame_parse(m, out.len + 4, SIZE_MAX, &f, &used, &err) < 0 ||
                used != out.len + 4 || f.len != len || (len && memcmp(f.payload, data + 1, len)))
                __builtin_trap();
            free(m);
        }
    }
    strbuf_free(&out);
    free(a);
    free(b);
    return 0;
}
