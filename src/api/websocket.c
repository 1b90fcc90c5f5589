/* api/websocket.c — RFC 6455 after the handshake: the accept key, frame parsing and unmasking,
 * fragment reassembly, server frames, and one connection's blocking reads and writes. */
#include "api/websocket.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/sha1.h"
#include "base/utf8.h"

#define WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#define WS_READ_CHUNK 16384

void ws_accept_key(const char *client_key, char out[WS_ACCEPT_LEN + 1])
{
    struct sha1 s;
    uint8_t digest[SHA1_DIGEST_BYTES];
    sha1_init(&s);
    sha1_update(&s, client_key, strlen(client_key));
    sha1_update(&s, WS_GUID, sizeof WS_GUID - 1);
    sha1_final(&s, digest);
    base64_encode(digest, sizeof digest, out);
}

bool ws_client_key_valid(const char *key)
{
    if (!key || strlen(key) != 24 || strcmp(key + 22, "=="))
        return false;
    for (int i = 0; i < 22; i++) {
        char c = key[i];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  c == '+' || c == '/';
        if (!ok)
            return false;
    }
    return true;
}

int ws_frame_parse(uint8_t *buf, size_t n, size_t max_payload, struct ws_frame *f, size_t *used,
                   struct err *err)
{
    *used = 0;
    if (n < 2)
        return 0;
    uint8_t b0 = buf[0], b1 = buf[1];
    if (b0 & 0x70)
        return err_set(err, INFERD_EFORMAT, "a frame with reserved bits set (0x%02x)", b0);
    uint8_t op = b0 & 0x0f;
    bool control = op & 0x8;
    if (op != WS_OP_CONTINUATION && op != WS_OP_TEXT && op != WS_OP_BINARY && op != WS_OP_CLOSE &&
        op != WS_OP_PING && op != WS_OP_PONG)
        return err_set(err, INFERD_EFORMAT, "a frame with the reserved opcode 0x%x", op);
    if (!(b1 & 0x80))
        return err_set(err, INFERD_EFORMAT, "an unmasked client frame (RFC 6455 §5.1)");
    uint64_t len = b1 & 0x7f;
    size_t at = 2;
    if (len == 126) {
        if (n < 4)
            return 0;
        len = (uint64_t)buf[2] << 8 | buf[3];
        if (len < 126)
            return err_set(err, INFERD_EFORMAT, "a %llu-byte payload in the 16-bit length form",
                           (unsigned long long)len);
        at = 4;
    } else if (len == 127) {
        if (n < 10)
            return 0;
        len = 0;
        for (int i = 0; i < 8; i++)
            len = len << 8 | buf[2 + i];
        if (len >> 63)
            return err_set(err, INFERD_EFORMAT, "a payload length with its top bit set");
        if (len < 65536)
            return err_set(err, INFERD_EFORMAT, "a %llu-byte payload in the 64-bit length form",
                           (unsigned long long)len);
        at = 10;
    }
    if (control && (!(b0 & 0x80) || len > 125))
        return err_set(err, INFERD_EFORMAT,
                       "a control frame (opcode 0x%x) fragmented or over 125 bytes (%llu)", op,
                       (unsigned long long)len);
    if (len > max_payload)
        return err_set(err, INFERD_ERANGE, "a %llu-byte frame; the limit is %zu",
                       (unsigned long long)len, max_payload);
    if (n - at < 4 || n - at - 4 < len)
        return 0;
    const uint8_t *mask = buf + at;
    uint8_t *p = buf + at + 4;
    for (size_t i = 0; i < len; i++)
        p[i] ^= mask[i & 3];
    f->fin = b0 & 0x80;
    f->opcode = op;
    f->payload = p;
    f->len = (size_t)len;
    *used = at + 4 + (size_t)len;
    return 0;
}

bool ws_frame_write(struct strbuf *out, enum ws_opcode op, const void *payload, size_t len)
{
    uint8_t h[10];
    size_t hn = 2;
    h[0] = 0x80 | (uint8_t)op;
    if (len < 126) {
        h[1] = (uint8_t)len;
    } else if (len < 65536) {
        h[1] = 126;
        h[2] = (uint8_t)(len >> 8);
        h[3] = (uint8_t)len;
        hn = 4;
    } else {
        h[1] = 127;
        for (int i = 0; i < 8; i++)
            h[2 + i] = (uint8_t)((uint64_t)len >> (56 - 8 * i));
        hn = 10;
    }
    strbuf_append(out, (const char *)h, hn);
    if (len)
        strbuf_append(out, payload, len);
    return !out->failed;
}

bool ws_reader_feed(struct ws_reader *r, const void *data, size_t n)
{
    return strbuf_append(&r->in, data, n);
}

static int reader_fail(struct ws_event *ev, int code, int rc)
{
    ev->kind = WS_EVENT_NONE;
    ev->close_code = code;
    return rc;
}

/* A close frame's code is 1000-4999 less the ones never sent on the wire (RFC 6455 §7.4). */
static bool close_code_valid(int c)
{
    if (c < 1000 || c >= 5000)
        return false;
    return !(c == 1004 || c == 1005 || c == 1006 || (c >= 1016 && c < 3000));
}

int ws_reader_next(struct ws_reader *r, struct ws_event *ev, struct err *err)
{
    memset(ev, 0, sizeof ev[0]);
    if (r->used) {
        strbuf_consume(&r->in, r->used);
        r->used = 0;
    }
    for (;;) {
        struct ws_frame f;
        size_t used;
        int rc = ws_frame_parse((uint8_t *)r->in.data, r->in.len, r->max_message, &f, &used, err);
        if (rc < 0)
            return reader_fail(ev, rc == -INFERD_ERANGE ? WS_CLOSE_TOO_BIG : WS_CLOSE_PROTOCOL,
                               rc);
        if (used == 0)
            return 0;
        r->used = used;
        switch (f.opcode) {
        case WS_OP_PING:
        case WS_OP_PONG:
            ev->kind = f.opcode == WS_OP_PING ? WS_EVENT_PING : WS_EVENT_PONG;
            ev->data = f.payload;
            ev->len = f.len;
            return 0;
        case WS_OP_CLOSE:
            if (f.len == 1)
                return reader_fail(ev, WS_CLOSE_PROTOCOL,
                                   err_set(err, INFERD_EFORMAT, "a one-byte close payload"));
            ev->kind = WS_EVENT_CLOSE;
            ev->close_code = 1005;
            if (f.len >= 2) {
                ev->close_code = f.payload[0] << 8 | f.payload[1];
                if (!close_code_valid(ev->close_code))
                    return reader_fail(ev, WS_CLOSE_PROTOCOL,
                                       err_set(err, INFERD_EFORMAT, "the close code %d",
                                               f.payload[0] << 8 | f.payload[1]));
                if (!utf8_valid(f.payload + 2, f.len - 2))
                    return reader_fail(ev, WS_CLOSE_BAD_DATA,
                                       err_set(err, INFERD_EFORMAT,
                                               "a close reason that is not UTF-8"));
                ev->data = f.payload + 2;
                ev->len = f.len - 2;
            }
            return 0;
        default:
            break;
        }
        if (f.opcode == WS_OP_CONTINUATION ? !r->in_message : r->in_message)
            return reader_fail(ev, WS_CLOSE_PROTOCOL,
                               err_set(err, INFERD_EFORMAT, "%s",
                                       r->in_message ? "a new message inside a fragmented one"
                                                     : "a continuation frame with no message"));
        if (f.opcode != WS_OP_CONTINUATION) {
            r->message_text = f.opcode == WS_OP_TEXT;
            strbuf_reset(&r->message);
        }
        if (r->message.len + f.len > r->max_message)
            return reader_fail(ev, WS_CLOSE_TOO_BIG,
                               err_set(err, INFERD_ERANGE, "a message over %zu bytes",
                                       r->max_message));
        if (f.len && !strbuf_append(&r->message, (const char *)f.payload, f.len))
            return reader_fail(ev, WS_CLOSE_TOO_BIG,
                               err_set(err, INFERD_ENOMEM, "out of memory for a message"));
        if (!f.fin) {
            r->in_message = true;
            strbuf_consume(&r->in, used);
            r->used = 0;
            continue;
        }
        r->in_message = false;
        const uint8_t *data = (const uint8_t *)(r->message.data ? r->message.data : "");
        if (r->message_text && !utf8_valid(data, r->message.len))
            return reader_fail(ev, WS_CLOSE_BAD_DATA,
                               err_set(err, INFERD_EFORMAT, "a text message that is not UTF-8"));
        ev->kind = WS_EVENT_MESSAGE;
        ev->text = r->message_text;
        ev->data = data;
        ev->len = r->message.len;
        return 0;
    }
}

void ws_reader_free(struct ws_reader *r)
{
    strbuf_free(&r->in);
    strbuf_free(&r->message);
}

/* ---- one connection ---- */

int ws_conn_init(struct ws_conn *c, int fd, size_t max_message, const void *early, size_t n_early,
                 struct err *err)
{
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->rd.max_message = max_message;
    if (n_early && !ws_reader_feed(&c->rd, early, n_early))
        return err_set(err, INFERD_ENOMEM, "out of memory for %zu bytes", n_early);
    return 0;
}

static int write_all(struct ws_conn *c, const char *p, size_t n)
{
    while (n > 0 && !c->broken) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            c->broken = true;
            break;
        }
        p += w;
        n -= (size_t)w;
    }
    return c->broken ? -INFERD_EIO : 0;
}

static int send_frame(struct ws_conn *c, enum ws_opcode op, const void *payload, size_t len)
{
    if (c->broken || c->close_sent)
        return -INFERD_EIO;
    struct strbuf b = {0};
    int rc = ws_frame_write(&b, op, payload, len) ? write_all(c, b.data, b.len) : -INFERD_ENOMEM;
    strbuf_free(&b);
    return rc;
}

int ws_conn_send_text(struct ws_conn *c, const char *text, size_t len)
{
    return send_frame(c, WS_OP_TEXT, text, len);
}

void ws_conn_close(struct ws_conn *c, int code, const char *reason)
{
    if (c->close_sent || c->broken)
        return;
    uint8_t p[125];
    size_t rl = reason ? strlen(reason) : 0;
    if (rl > sizeof p - 2)
        rl = sizeof p - 2;
    p[0] = (uint8_t)(code >> 8);
    p[1] = (uint8_t)code;
    if (rl)
        memcpy(p + 2, reason, rl);
    send_frame(c, WS_OP_CLOSE, p, 2 + rl);
    c->close_sent = true;
}

int ws_conn_next(struct ws_conn *c, int timeout_ms, struct ws_event *ev)
{
    for (;;) {
        struct err err = {0};
        if (ws_reader_next(&c->rd, ev, &err) < 0) {
            ws_conn_close(c, ev->close_code, err.msg);
            return -INFERD_EIO;
        }
        switch (ev->kind) {
        case WS_EVENT_MESSAGE:
            return 0;
        case WS_EVENT_PING:
            if (send_frame(c, WS_OP_PONG, ev->data, ev->len) < 0)
                return -INFERD_EIO;
            continue;
        case WS_EVENT_PONG:
            continue;
        case WS_EVENT_CLOSE:
            /* Echo the code as the closing handshake asks (§5.5.1); 1005 is never sent. */
            c->close_received = true;
            ws_conn_close(c, ev->close_code == 1005 ? WS_CLOSE_NORMAL : ev->close_code, NULL);
            return -INFERD_EIO;
        case WS_EVENT_NONE:
            break;
        }
        if (c->broken || c->close_received)
            return -INFERD_EIO;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int pr = poll(&p, 1, timeout_ms);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0) {
            ev->kind = WS_EVENT_NONE;
            return 0;
        }
        char buf[WS_READ_CHUNK];
        ssize_t got = pr < 0 ? -1 : recv(c->fd, buf, sizeof buf, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            c->broken = true;
            return -INFERD_EIO;
        }
        /* The reader holds at most one unfinished frame (its header is checked against the
         * limit before its payload arrives) and this chunk. */
        if (!ws_reader_feed(&c->rd, buf, (size_t)got)) {
            ws_conn_close(c, WS_CLOSE_TOO_BIG, "out of memory");
            return -INFERD_EIO;
        }
    }
}

void ws_conn_free(struct ws_conn *c)
{
    ws_reader_free(&c->rd);
}
