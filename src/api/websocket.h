/* api/websocket.h — the WebSocket protocol (RFC 6455) after the handshake: the accept key, client
 * frames read and unmasked into messages (fragments joined, control frames between them), server
 * frames written, and one connection's blocking I/O with ping/pong and the closing handshake
 * answered on its own. Frames are outside input: fuzz/fuzz_websocket.c drives the reader. */
#ifndef INFERD_API_WEBSOCKET_H
#define INFERD_API_WEBSOCKET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/strbuf.h"

enum ws_opcode {
    WS_OP_CONTINUATION = 0x0,
    WS_OP_TEXT = 0x1,
    WS_OP_BINARY = 0x2,
    WS_OP_CLOSE = 0x8,
    WS_OP_PING = 0x9,
    WS_OP_PONG = 0xA,
};

/* Close codes (RFC 6455 §7.4.1) this side sends. */
#define WS_CLOSE_NORMAL 1000
#define WS_CLOSE_GOING_AWAY 1001
#define WS_CLOSE_PROTOCOL 1002
#define WS_CLOSE_BAD_DATA 1007 /* a text message that is not UTF-8 */
#define WS_CLOSE_TOO_BIG 1009

/* Sec-WebSocket-Accept for a client's Sec-WebSocket-Key: base64(SHA-1(key + the RFC's GUID)),
 * 28 characters and a NUL. */
#define WS_ACCEPT_LEN 28
void ws_accept_key(const char *client_key, char out[WS_ACCEPT_LEN + 1]);
/* A Sec-WebSocket-Key is the base64 of 16 bytes: 24 characters ending in "==". */
bool ws_client_key_valid(const char *key);

/* One frame as it arrived. */
struct ws_frame {
    bool fin;
    uint8_t opcode;
    uint8_t *payload; /* into the caller's buffer, unmasked in place; len bytes */
    size_t len;
};

/* Parses the client frame at the start of buf (n bytes). Returns 0 with *used the frame's size
 * in bytes, or *used 0 when buf does not yet hold the whole frame; else -INFERD_EFORMAT (a
 * protocol error: unmasked, reserved bits or opcodes, a fragmented or long control frame, a
 * non-minimal length) or -INFERD_ERANGE (payload over max_payload), err saying which. */
int ws_frame_parse(uint8_t *buf, size_t n, size_t max_payload, struct ws_frame *f, size_t *used,
                   struct err *err);

/* Appends a server frame (unmasked, final) to out; false when out failed. */
bool ws_frame_write(struct strbuf *out, enum ws_opcode op, const void *payload, size_t len);

enum ws_event_kind {
    WS_EVENT_NONE,    /* nothing complete yet */
    WS_EVENT_MESSAGE, /* a whole text or binary message */
    WS_EVENT_PING,
    WS_EVENT_PONG,
    WS_EVENT_CLOSE,   /* the peer's close frame */
};

struct ws_event {
    enum ws_event_kind kind;
    bool text;              /* a message: text (valid UTF-8) or binary */
    const uint8_t *data;    /* borrowed until the next ws_reader call; len bytes */
    size_t len;
    int close_code;         /* WS_EVENT_CLOSE: the peer's code (1005 when it gave none); on an
                               error, the code to close with */
};

/* The client's bytes in, events out: frames parsed as they complete, fragments joined into
 * messages of at most max_message bytes. A zeroed reader with max_message set is ready. */
struct ws_reader {
    size_t max_message;
    struct strbuf in;      /* owned; bytes not yet parsed */
    struct strbuf message; /* owned; the fragments of the message under way */
    bool in_message;
    bool message_text;
    size_t used;           /* bytes of in the last event's frame took, dropped on the next call */
};

/* Appends n bytes read from the connection; false when memory ran out. */
bool ws_reader_feed(struct ws_reader *r, const void *data, size_t n);
/* The next event from what was fed. Returns 0 (ev->kind NONE when more bytes are needed), or a
 * negative code with err filled and ev->close_code the code to close the connection with
 * (1002, 1007, 1009). After an error the connection must be closed. */
int ws_reader_next(struct ws_reader *r, struct ws_event *ev, struct err *err);
void ws_reader_free(struct ws_reader *r);

/* One upgraded connection, driven by one thread. */
struct ws_conn {
    int fd;               /* borrowed; the transport closes it */
    struct ws_reader rd;
    bool close_sent;
    bool close_received;
    bool broken;          /* a read or write failed, or the peer closed: nothing more goes out */
};

/* Starts a connection on fd, with bytes the transport read past the handshake (may be 0). */
int ws_conn_init(struct ws_conn *c, int fd, size_t max_message, const void *early, size_t n_early,
                 struct err *err);
/* Sends one text message (blocking until written); -INFERD_EIO when the peer is gone. */
int ws_conn_send_text(struct ws_conn *c, const char *text, size_t len);
/* Waits up to timeout_ms (-1: for ever) for the next message. Pings are answered and pongs
 * dropped on the way. Returns 0 with ev->kind MESSAGE, or NONE when the time ran out;
 * -INFERD_EIO when the connection is over (the peer closed, with the close answered; a
 * protocol error, with a close frame sent; a read error or end of file). */
int ws_conn_next(struct ws_conn *c, int timeout_ms, struct ws_event *ev);
/* Sends a close frame (once) with code and a short reason. */
void ws_conn_close(struct ws_conn *c, int code, const char *reason);
void ws_conn_free(struct ws_conn *c);

#endif
