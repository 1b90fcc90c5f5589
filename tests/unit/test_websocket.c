/* tests/unit/test_websocket.c — the WebSocket protocol pieces: SHA-1 and base64 against their
 * standards' vectors, RFC 6455's own handshake and frame examples, fragments joined around
 * control frames, and every protocol error closing with the right code. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "api/websocket.h"
#include "base/sha1.h"

static void hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

Test(sha1, matches_fips_180_vectors_across_block_boundaries)
{
    uint8_t d[SHA1_DIGEST_BYTES];
    char h[41];
    sha1_digest("abc", 3, d);
    hex(d, sizeof d, h);
    cr_assert_str_eq(h, "a9993e364706816aba3e25717850c26c9cd0d89d");
    sha1_digest("", 0, d);
    hex(d, sizeof d, h);
    cr_assert_str_eq(h, "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha1_digest(two, strlen(two), d);
    hex(d, sizeof d, h);
    cr_assert_str_eq(h, "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
    /* A million 'a's fed in uneven pieces. */
    struct sha1 s;
    sha1_init(&s);
    char a[997];
    memset(a, 'a', sizeof a);
    size_t left = 1000000;
    while (left) {
        size_t n = left < sizeof a ? left : sizeof a;
        sha1_update(&s, a, n);
        left -= n;
    }
    sha1_final(&s, d);
    hex(d, sizeof d, h);
    cr_assert_str_eq(h, "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
}

Test(base64, pads_as_rfc_4648_says)
{
    static const char *const in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *const out[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (size_t i = 0; i < 7; i++) {
        char b[16];
        base64_encode(in[i], strlen(in[i]), b);
        cr_assert_str_eq(b, out[i]);
        cr_assert_eq(strlen(b), BASE64_LEN(strlen(in[i])));
    }
}

Test(websocket, accept_key_is_the_rfc_example)
{
    char accept[WS_ACCEPT_LEN + 1];
    ws_accept_key("dGhlIHNhbXBsZSBub25jZQ==", accept);
    cr_assert_str_eq(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    cr_assert(ws_client_key_valid("dGhlIHNhbXBsZSBub25jZQ=="));
    cr_assert_not(ws_client_key_valid("dGhlIHNhbXBsZSBub25jZQ"));
    cr_assert_not(ws_client_key_valid("dGhlIHNhbXBsZSBub25jZ!=="));
    cr_assert_not(ws_client_key_valid(NULL));
}

/* RFC 6455 §5.7: a masked "Hello". */
static const uint8_t masked_hello[] = {0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d,
                                       0x7f, 0x9f, 0x4d, 0x51, 0x58};

Test(websocket, masked_hello_parses_whole_and_waits_when_cut)
{
    uint8_t buf[sizeof masked_hello];
    struct ws_frame f;
    size_t used;
    struct err err = {0};
    for (size_t n = 0; n < sizeof buf; n++) {
        memcpy(buf, masked_hello, sizeof buf);
        cr_assert_eq(ws_frame_parse(buf, n, 1024, &f, &used, &err), 0);
        cr_assert_eq(used, 0, "%zu bytes are not a frame yet", n);
    }
    memcpy(buf, masked_hello, sizeof buf);
    cr_assert_eq(ws_frame_parse(buf, sizeof buf, 1024, &f, &used, &err), 0);
    cr_assert_eq(used, sizeof buf);
    cr_assert(f.fin);
    cr_assert_eq(f.opcode, WS_OP_TEXT);
    cr_assert_eq(f.len, 5);
    cr_assert_eq(memcmp(f.payload, "Hello", 5), 0);
}

/* A client frame: masked with a fixed key. */
static void client_frame(struct strbuf *b, int b0, const char *payload, size_t len)
{
    static const uint8_t key[4] = {1, 2, 3, 4};
    uint8_t h[14];
    size_t hn = 2;
    h[0] = (uint8_t)b0;
    if (len < 126) {
        h[1] = 0x80 | (uint8_t)len;
    } else {
        h[1] = 0x80 | 126;
        h[2] = (uint8_t)(len >> 8);
        h[3] = (uint8_t)len;
        hn = 4;
    }
    memcpy(h + hn, key, 4);
    strbuf_append(b, (const char *)h, hn + 4);
    for (size_t i = 0; i < len; i++)
        strbuf_putc(b, (char)(payload[i] ^ key[i & 3]));
}

Test(websocket, fragments_join_around_a_ping)
{
    struct strbuf in = {0};
    client_frame(&in, 0x01, "Hel", 3);         /* text, not final */
    client_frame(&in, 0x89, "p", 1);           /* ping between fragments */
    client_frame(&in, 0x80, "lo", 2);          /* final continuation */
    struct ws_reader r = {.max_message = 64};
    struct ws_event ev;
    struct err err = {0};
    /* Fed one byte at a time: nothing completes early. */
    int kinds[4], n = 0;
    char message[16] = "";
    for (size_t i = 0; i < in.len; i++) {
        cr_assert(ws_reader_feed(&r, in.data + i, 1));
        for (;;) {
            cr_assert_eq(ws_reader_next(&r, &ev, &err), 0, "%s", err.msg);
            if (ev.kind == WS_EVENT_NONE)
                break;
            kinds[n++] = ev.kind;
            if (ev.kind == WS_EVENT_MESSAGE)
                snprintf(message, sizeof message, "%.*s", (int)ev.len, (const char *)ev.data);
        }
    }
    cr_assert_eq(n, 2);
    cr_assert_eq(kinds[0], WS_EVENT_PING);
    cr_assert_eq(kinds[1], WS_EVENT_MESSAGE);
    cr_assert_str_eq(message, "Hello");
    ws_reader_free(&r);
    strbuf_free(&in);
}

/* The close code and a message fragment for one malformed input. */
static void assert_refused(const char *bytes, size_t n, int code, const char *fragment)
{
    struct ws_reader r = {.max_message = 16};
    struct ws_event ev;
    struct err err = {0};
    cr_assert(ws_reader_feed(&r, bytes, n));
    int rc;
    do
        rc = ws_reader_next(&r, &ev, &err);
    while (rc == 0 && ev.kind != WS_EVENT_NONE);
    cr_assert_lt(rc, 0, "refused: %s", fragment);
    cr_assert_eq(ev.close_code, code, "%s: close code %d", fragment, ev.close_code);
    cr_assert(strstr(err.msg, fragment), "'%s' in '%s'", fragment, err.msg);
    ws_reader_free(&r);
}

Test(websocket, protocol_errors_close_with_their_codes)
{
    struct strbuf b = {0};
    assert_refused("\x81\x02hi", 4, WS_CLOSE_PROTOCOL, "unmasked");
    assert_refused("\xc1\x80\0\0\0\0", 6, WS_CLOSE_PROTOCOL, "reserved bits");
    assert_refused("\x83\x80\0\0\0\0", 6, WS_CLOSE_PROTOCOL, "reserved opcode");
    client_frame(&b, 0x09, "x", 1); /* a fragmented ping */
    assert_refused(b.data, b.len, WS_CLOSE_PROTOCOL, "control frame");
    strbuf_reset(&b);
    client_frame(&b, 0x80, "x", 1);
    assert_refused(b.data, b.len, WS_CLOSE_PROTOCOL, "continuation frame with no message");
    strbuf_reset(&b);
    client_frame(&b, 0x01, "a", 1);
    client_frame(&b, 0x81, "b", 1);
    assert_refused(b.data, b.len, WS_CLOSE_PROTOCOL, "new message inside");
    strbuf_reset(&b);
    client_frame(&b, 0x81, "\xff", 1);
    assert_refused(b.data, b.len, WS_CLOSE_BAD_DATA, "not UTF-8");
    strbuf_reset(&b);
    client_frame(&b, 0x82, "0123456789abcdefg", 17); /* one byte over the limit */
    assert_refused(b.data, b.len, WS_CLOSE_TOO_BIG, "limit is 16");
    strbuf_reset(&b);
    client_frame(&b, 0x02, "0123456789", 10);
    client_frame(&b, 0x80, "0123456789", 10); /* the message, not a frame, over the limit */
    assert_refused(b.data, b.len, WS_CLOSE_TOO_BIG, "message over 16");
    strbuf_reset(&b);
    client_frame(&b, 0x88, "\x03\xed", 2); /* close code 1005 is never sent */
    assert_refused(b.data, b.len, WS_CLOSE_PROTOCOL, "close code 1005");
    /* A 16-bit length form holding a length that fits in 7 bits. */
    assert_refused("\x81\xfe\x00\x05", 4, WS_CLOSE_PROTOCOL, "16-bit length form");
    strbuf_free(&b);
}

Test(websocket, a_close_frame_carries_its_code_and_reason)
{
    struct strbuf b = {0};
    client_frame(&b, 0x88, "\x03\xe8" "bye", 5);
    struct ws_reader r = {.max_message = 16};
    struct ws_event ev;
    struct err err = {0};
    cr_assert(ws_reader_feed(&r, b.data, b.len));
    cr_assert_eq(ws_reader_next(&r, &ev, &err), 0);
    cr_assert_eq(ev.kind, WS_EVENT_CLOSE);
    cr_assert_eq(ev.close_code, 1000);
    cr_assert_eq(ev.len, 3);
    cr_assert_eq(memcmp(ev.data, "bye", 3), 0);
    ws_reader_free(&r);
    strbuf_free(&b);
}

Test(websocket, server_frames_use_the_shortest_length_form)
{
    static char big[70000];
    size_t lens[] = {0, 125, 126, 65535, 65536, sizeof big};
    size_t heads[] = {2, 2, 4, 4, 10, 10};
    for (size_t i = 0; i < 6; i++) {
        struct strbuf b = {0};
        cr_assert(ws_frame_write(&b, WS_OP_BINARY, big, lens[i]));
        cr_assert_eq(b.len, heads[i] + lens[i]);
        cr_assert_eq((uint8_t)b.data[0], 0x82);
        cr_assert_eq((uint8_t)b.data[1] & 0x80, 0, "server frames are not masked");
        strbuf_free(&b);
    }
}
