/* api/admin_socket.c — the --isolate admin socket: an accept thread, one thread per
 * connection, a request line and headers read whole, and the two routes. */
#define _GNU_SOURCE
#include "api/admin_socket.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "api/engine_proxy.h"
#include "api/model_pool.h"
#include "base/log.h"
#include "base/timer.h"

#define POLL_MS 200
#define MAX_HEAD 8192
#define HEAD_TIMEOUT_MS 5000
#define MAX_CONNECTIONS 64
#define DRAIN_TIMEOUT_MS 60000

struct admin_socket {
    struct server *srv; /* borrowed */
    char path[108];
    int fd;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;                      /* under mu */
    int conns[MAX_CONNECTIONS];     /* under mu: open connections, -1 free */
    int n_conns;
};

struct conn {
    struct admin_socket *a;
    int fd;
    int slot;
};

/* ---- drain ---- */

static uint64_t drain_one(void *ctx, struct served_model *sm)
{
    (void)ctx;
    const struct engine_config *c = served_engine_config(sm);
    if (!c || !c->tier)
        return 0;
    struct err err = {0};
    if (served_engine_flush(sm, DRAIN_TIMEOUT_MS, NULL, &err) < 0) {
        log_warn("admin: drain of %s: %s", sm->id, err.msg);
        return 0;
    }
    struct engine_stats st;
    served_engine_stats(sm, &st);
    return st.prompt_cache.blocks;
}

uint64_t admin_drain(struct server *srv)
{
    if (srv->pool)
        return model_pool_each_resident(srv->pool, drain_one, NULL);
    if (!atomic_load(&srv->ready) || !served_engine_ready(&srv->served))
        return 0;
    return drain_one(NULL, &srv->served);
}

/* ---- HTTP, as little as two routes need ---- */

static void write_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return;
        s += k;
        n -= (size_t)k;
    }
}

static void respond(int fd, int status, const char *reason, const char *json)
{
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     status, reason, strlen(json));
    write_all(fd, head, (size_t)n);
    write_all(fd, json, strlen(json));
}

/* Reads the request head (up to the blank line); false on a timeout, EOF or an oversize head. */
static bool read_head(int fd, char *buf, size_t cap, size_t *len)
{
    *len = 0;
    uint64_t deadline = now_ns() + (uint64_t)HEAD_TIMEOUT_MS * 1000000ull;
    while (*len + 1 < cap) {
        buf[*len] = '\0';
        if (strstr(buf, "\r\n\r\n"))
            return true;
        uint64_t now = now_ns();
        if (now >= deadline)
            return false;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, (int)((deadline - now) / 1000000ull) + 1) <= 0)
            continue;
        ssize_t k = read(fd, buf + *len, cap - 1 - *len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        *len += (size_t)k;
    }
    buf[*len] = '\0';
    return strstr(buf, "\r\n\r\n") != NULL;
}

/* Holds the lease until the client goes away (or the socket closes). */
static void hold_lease(struct admin_socket *a, int fd)
{
    struct engine_supervisor *sup = a->srv->isolation;
    engine_supervisor_lease(sup);
    log_info("admin: device lease taken (%d held): engines paused", engine_supervisor_leases(sup));
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                               "Cache-Control: no-store\r\nConnection: close\r\n\r\nleased\n";
    write_all(fd, head, sizeof head - 1);
    char sink[256];
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int k = poll(&pf, 1, POLL_MS);
        if (k < 0 && errno != EINTR)
            break;
        if (k > 0) {
            ssize_t n = read(fd, sink, sizeof sink);
            if (n == 0 || (n < 0 && errno != EINTR))
                break; /* the client went away: the lease ends */
        }
        pthread_mutex_lock(&a->mu);
        bool stop = a->stop;
        pthread_mutex_unlock(&a->mu);
        if (stop)
            break;
    }
    engine_supervisor_unlease(sup);
    log_info("admin: device lease released (%d held)", engine_supervisor_leases(sup));
}

static void *conn_run(void *arg)
{
    struct conn *cn = arg;
    struct admin_socket *a = cn->a;
    char head[MAX_HEAD];
    size_t len = 0;
    if (read_head(cn->fd, head, sizeof head, &len)) {
        char method[16] = "", path[256] = "";
        if (sscanf(head, "%15s %255s", method, path) != 2) {
            respond(cn->fd, 400, "Bad Request", "{\"error\":{\"message\":\"bad request line\"}}");
        } else if (strcmp(path, "/admin/drain") && strcmp(path, "/admin/lease")) {
            respond(cn->fd, 404, "Not Found", "{\"error\":{\"message\":\"not found\"}}");
        } else if (strcmp(method, "POST")) {
            respond(cn->fd, 405, "Method Not Allowed",
                    "{\"error\":{\"message\":\"method not allowed\"}}");
        } else if (!strcmp(path, "/admin/drain")) {
            uint64_t t0 = now_ns();
            uint64_t demotions = admin_drain(a->srv);
            char body[128];
            snprintf(body, sizeof body, "{\"drained\": true, \"demotions\": %llu}",
                     (unsigned long long)demotions);
            log_info("admin: drained %llu cached blocks to the SSD tier in %.1f ms",
                     (unsigned long long)demotions, (double)(now_ns() - t0) * 1e-6);
            respond(cn->fd, 200, "OK", body);
        } else {
            hold_lease(a, cn->fd);
        }
    }
    pthread_mutex_lock(&a->mu);
    a->conns[cn->slot] = -1;
    a->n_conns--;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    close(cn->fd);
    free(cn);
    return NULL;
}

static void *accept_run(void *arg)
{
    struct admin_socket *a = arg;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        bool stop = a->stop;
        pthread_mutex_unlock(&a->mu);
        if (stop)
            return NULL;
        struct pollfd pf = {.fd = a->fd, .events = POLLIN};
        if (poll(&pf, 1, POLL_MS) <= 0)
            continue;
        int fd = accept4(a->fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        struct conn *cn = malloc(sizeof *cn);
        pthread_mutex_lock(&a->mu);
        int slot = -1;
        for (int i = 0; i < MAX_CONNECTIONS && slot < 0; i++)
            if (a->conns[i] < 0)
                slot = i;
        if (slot >= 0 && cn) {
            a->conns[slot] = fd;
            a->n_conns++;
        }
        pthread_mutex_unlock(&a->mu);
        if (slot < 0 || !cn) {
            respond(fd, 503, "Service Unavailable",
                    "{\"error\":{\"message\":\"too many admin connections\"}}");
            close(fd);
            free(cn);
            continue;
        }
        *cn = (struct conn){.a = a, .fd = fd, .slot = slot};
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_t t;
        if (pthread_create(&t, &at, conn_run, cn) != 0) {
            pthread_mutex_lock(&a->mu);
            a->conns[slot] = -1;
            a->n_conns--;
            pthread_mutex_unlock(&a->mu);
            close(fd);
            free(cn);
        }
        pthread_attr_destroy(&at);
    }
}

int admin_socket_start(struct server *srv, const char *path, struct admin_socket **out,
                       struct err *err)
{
    *out = NULL;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
        return err_set(err, INFERD_ERANGE, "--admin-socket %s: longer than %zu bytes", path,
                       sizeof sa.sun_path - 1);
    struct admin_socket *a = calloc(1, sizeof *a);
    if (!a)
        return err_set(err, INFERD_ENOMEM, "out of memory for the admin socket");
    a->srv = srv;
    snprintf(a->path, sizeof a->path, "%s", path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    for (int i = 0; i < MAX_CONNECTIONS; i++)
        a->conns[i] = -1;
    a->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (a->fd < 0) {
        free(a);
        return err_set(err, INFERD_EIO, "--admin-socket: socket: %s", strerror(errno));
    }
    unlink(path);
    mode_t old = umask(0077);
    int rc = bind(a->fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    if (rc < 0 || listen(a->fd, 16) < 0) {
        int e = errno;
        close(a->fd);
        free(a);
        return err_set(err, INFERD_EIO, "--admin-socket %s: %s", path, strerror(e));
    }
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (pthread_create(&a->thread, NULL, accept_run, a) != 0) {
        close(a->fd);
        unlink(path);
        free(a);
        return err_set(err, INFERD_EIO, "--admin-socket: cannot start its thread");
    }
    *out = a;
    return 0;
}

void admin_socket_stop(struct admin_socket *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    a->stop = true;
    for (int i = 0; i < MAX_CONNECTIONS; i++)
        if (a->conns[i] >= 0)
            shutdown(a->conns[i], SHUT_RDWR);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL);
    pthread_mutex_lock(&a->mu);
    while (a->n_conns > 0)
        pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
    close(a->fd);
    unlink(a->path);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}
