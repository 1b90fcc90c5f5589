/* bench/sse_streams.c — a load generator for streamed completions that costs the machine
 * almost nothing: every request is sent at once on its own connection, one thread polls them
 * all, and each text chunk's arrival time is taken without parsing its JSON. On a machine of
 * two cores a client in Python (a thread per stream, the JSON of every chunk decoded) takes
 * a tenth of the CPU time the server has to decode with; this one takes well under 1%.
 *
 * Usage: sse_streams HOST PORT PATH < BODIES
 *   BODIES: one JSON request body a line, each POSTed to PATH with "stream": true in it.
 * Output, a line per request in input order:
 *   I TOKENS SENT T1 T2 ...
 * TOKENS is usage.completion_tokens of the final chunk (-1 without usage), SENT the time the
 * request went out and T1.. each text chunk's arrival (a chunk whose "text" or "content" is
 * not empty), seconds on one monotonic clock. Exit status 1 with a message on an HTTP status
 * other than 200, a malformed chunked body, or a connection that closes before [DONE]. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_STREAMS 1024
#define MAX_BODY (1 << 20)
#define RECV_BYTES (64 * 1024)

enum parse_state { IN_HEADERS, CHUNK_SIZE, CHUNK_DATA, CHUNK_END, FINISHED };

struct stream {
    int fd;
    double sent;
    enum parse_state state;
    char *in; /* received bytes not yet parsed */
    size_t in_len, in_cap;
    size_t chunk_left;
    char *event; /* the SSE event being read */
    size_t event_len, event_cap;
    double *times;
    size_t n_times, times_cap;
    long tokens;
    bool done; /* [DONE] seen */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("sse_streams: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 4096;
        while (c < *len + n + 1)
            c *= 2;
        char *nb = realloc(*buf, c);
        if (!nb)
            die("out of memory (%zu bytes)", c);
        *buf = nb;
        *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = '\0';
}

static void note_time(struct stream *s, double t)
{
    if (s->n_times == s->times_cap) {
        s->times_cap = s->times_cap ? 2 * s->times_cap : 256;
        s->times = realloc(s->times, s->times_cap * sizeof *s->times);
        if (!s->times)
            die("out of memory (%zu times)", s->times_cap);
    }
    s->times[s->n_times++] = t;
}

/* True when the field's string value right after `key` is not empty. */
static bool has_text(const char *line, const char *key)
{
    const char *p = strstr(line, key);
    return p && p[strlen(key)] != '"';
}

/* One SSE event (its lines, without the blank line that ended it). */
static void take_event(struct stream *s, char *ev, double t)
{
    for (char *line = ev; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (!strncmp(line, "data: ", 6)) {
            const char *data = line + 6;
            if (!strcmp(data, "[DONE]")) {
                s->done = true;
            } else {
                if (has_text(data, "\"text\":\"") || has_text(data, "\"content\":\""))
                    note_time(s, t);
                const char *u = strstr(data, "\"completion_tokens\":");
                if (u)
                    s->tokens = strtol(u + strlen("\"completion_tokens\":"), NULL, 10);
            }
        }
        line = nl ? nl + 1 : NULL;
    }
}

/* Body bytes (chunked framing removed): cut into events at blank lines. */
static void take_body(struct stream *s, const char *p, size_t n, double t)
{
    append(&s->event, &s->event_len, &s->event_cap, p, n);
    char *start = s->event, *end;
    while ((end = strstr(start, "\n\n"))) {
        *end = '\0';
        take_event(s, start, t);
        start = end + 2;
    }
    size_t rest = s->event_len - (size_t)(start - s->event);
    memmove(s->event, start, rest + 1);
    s->event_len = rest;
}

/* Received bytes: the response's framing parsed off the front of `in` as far as it is
 * complete; the body's bytes go to the events. */
static void take_bytes(struct stream *s, size_t idx, const char *p, size_t n, double t)
{
    append(&s->in, &s->in_len, &s->in_cap, p, n);
    size_t at = 0;
    for (;;) {
        char *cur = s->in + at;
        size_t left = s->in_len - at;
        if (s->state == IN_HEADERS) {
            char *end = memmem(cur, left, "\r\n\r\n", 4);
            if (!end)
                break;
            *end = '\0';
            int status = 0;
            if (sscanf(cur, "HTTP/1.%*d %d", &status) != 1)
                die("request %zu: the answer does not start with an HTTP status line", idx);
            if (status != 200)
                die("request %zu: the server answered %d", idx, status);
            if (!strcasestr(cur, "transfer-encoding: chunked"))
                die("request %zu: the stream is not chunked", idx);
            at += (size_t)(end - cur) + 4;
            s->state = CHUNK_SIZE;
        } else if (s->state == CHUNK_SIZE) {
            char *crlf = memmem(cur, left, "\r\n", 2);
            if (!crlf)
                break;
            char *stop;
            s->chunk_left = strtoul(cur, &stop, 16);
            if (stop == cur)
                die("request %zu: a malformed chunk size", idx);
            at += (size_t)(crlf - cur) + 2;
            s->state = s->chunk_left ? CHUNK_DATA : FINISHED;
        } else if (s->state == CHUNK_DATA) {
            if (left == 0)
                break;
            size_t k = left < s->chunk_left ? left : s->chunk_left;
            take_body(s, cur, k, t);
            at += k;
            s->chunk_left -= k;
            if (s->chunk_left == 0)
                s->state = CHUNK_END;
        } else if (s->state == CHUNK_END) {
            if (left < 2)
                break;
            if (memcmp(cur, "\r\n", 2))
                die("request %zu: a chunk without its CRLF", idx);
            at += 2;
            s->state = CHUNK_SIZE;
        } else { /* FINISHED: a trailer, if any, is ignored */
            at = s->in_len;
            break;
        }
    }
    memmove(s->in, s->in + at, s->in_len - at);
    s->in_len -= at;
}

static int connect_to(const char *host, const char *port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc)
        die("cannot resolve %s: %s", host, gai_strerror(rc));
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) < 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        die("cannot connect to %s port %s: %s", host, port, strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            die("send failed: %s", strerror(errno));
        p += w;
        n -= (size_t)w;
    }
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: sse_streams HOST PORT PATH < BODIES (a JSON body a line)\n");
        return 2;
    }
    const char *host = argv[1], *port = argv[2], *path = argv[3];
    static struct stream streams[MAX_STREAMS];
    static char *bodies[MAX_STREAMS];
    size_t n = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, stdin)) > 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0)
            continue;
        if (n == MAX_STREAMS || len > MAX_BODY)
            die("too many or too long request bodies (at line %zu)", n + 1);
        bodies[n++] = strdup(line);
    }
    free(line);
    if (n == 0)
        die("no request bodies on standard input");

    for (size_t i = 0; i < n; i++) { /* connect first, so the requests go out together */
        streams[i].fd = connect_to(host, port);
        streams[i].tokens = -1;
    }
    for (size_t i = 0; i < n; i++) {
        char head[512];
        int h = snprintf(head, sizeof head,
                         "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                         path, host, strlen(bodies[i]));
        streams[i].sent = now_s();
        send_all(streams[i].fd, head, (size_t)h);
        send_all(streams[i].fd, bodies[i], strlen(bodies[i]));
    }

    struct pollfd *pfd = calloc(n, sizeof *pfd);
    size_t *which = calloc(n, sizeof *which);
    char *buf = malloc(RECV_BYTES);
    if (!pfd || !which || !buf)
        die("out of memory (%zu streams)", n);
    for (;;) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (streams[i].fd >= 0) {
                pfd[k] = (struct pollfd){.fd = streams[i].fd, .events = POLLIN};
                which[k++] = i;
            }
        if (k == 0)
            break;
        if (poll(pfd, k, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("poll failed: %s", strerror(errno));
        }
        for (size_t j = 0; j < k; j++) {
            if (!pfd[j].revents)
                continue;
            struct stream *s = &streams[which[j]];
            ssize_t r = recv(s->fd, buf, RECV_BYTES, 0);
            double t = now_s();
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                close(s->fd);
                s->fd = -1;
                if (!s->done)
                    die("request %zu: the connection closed before [DONE]", which[j]);
                continue;
            }
            take_bytes(s, which[j], buf, (size_t)r, t);
        }
    }
    for (size_t i = 0; i < n; i++) {
        printf("%zu %ld %.6f", i, streams[i].tokens, streams[i].sent);
        for (size_t j = 0; j < streams[i].n_times; j++)
            printf(" %.6f", streams[i].times[j]);
        putchar('\n');
        free(streams[i].times);
        free(streams[i].in);
        free(streams[i].event);
        free(bodies[i]);
    }
    free(pfd);
    free(which);
    free(buf);
    return 0;
}
