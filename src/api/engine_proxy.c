/* api/engine_proxy.c — the supervisor's side of serve --isolate: one thread per engine child
 * spawns it, reads its frames into the requests' gen_outputs, and watches it (exit, step
 * progress); handlers' threads send requests and calls and wait for their answers. */
#define _GNU_SOURCE
#include "api/engine_proxy.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/timer.h"

#define POLL_MS 100
#define READ_CHUNK (64 * 1024)
#define MAX_RESTART_HISTORY 16

/* A request sent to the child: the output the proxy fills (one reference held) until its
 * finish comes or the child is lost. */
struct submit_wait {
    bool done;
    int rc;
    char msg[512];
};

struct request {
    uint64_t id;
    struct gen_output *out;   /* one reference, the proxy's */
    struct submit_wait *wait; /* the submitter's, until SUBMITTED answers it */
    bool cancel_sent;
    bool got_token;
    uint64_t t_submit_ns, t_last_ns;
    uint64_t t_admit_ns; /* the child's admission, once an event has told it; 0 before */
    struct request *next;
};

struct call_wait {
    uint64_t id;
    bool done;
    struct engine_wire_reply *reply; /* the caller's */
    struct call_wait *next;
};

enum proxy_state { PROXY_STARTING, PROXY_RUNNING, PROXY_RESTARTING, PROXY_STOPPED };

static const char *const state_names[] = {"starting", "running", "restarting", "stopped"};

struct engine_proxy {
    struct engine_supervisor *sup;
    char id[256];
    char **argv;              /* owned; exe, the caller's args, the socket; NULL-terminated */
    char socket[108];
    int listen_fd;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t wmu;      /* one frame writer at a time; fd changes only under it too */
    /* under mu: */
    int fd;                   /* the child's connection; -1 while none */
    pid_t pid;
    enum proxy_state state;
    bool stopping;
    uint64_t stop_deadline_ns;
    bool started_once;        /* the first HELLO came (engine_proxy_start returned) */
    int start_rc;
    struct err start_err;
    struct request *reqs;
    int n_reqs;
    struct call_wait *calls;
    uint64_t next_id;
    int restarts;
    uint64_t crashes, hangs;
    uint64_t restart_ns[MAX_RESTART_HISTORY];
    uint64_t steps, progress_ns; /* the child's step count, and when it last moved */
    bool paused;
    uint64_t paused_ns;
    struct engine_wire_hello hello;
    struct engine_config cfg;    /* hello's, tier and spec pointing at the marks below */
    struct kv_tier_config tier_mark;
    struct spec_config spec_mark;
    struct engine_stats last_stats;
    char spec_kind[32], state_text[32], ssd_dir[1024];
    struct engine_metrics metrics;
    struct strbuf in;            /* the proxy thread's: bytes read, not yet parsed */
    struct engine_proxy *next;   /* the supervisor's registry */
};

struct engine_supervisor {
    struct engine_supervisor_config cfg;
    char exe[4096];
    char runtime_dir[256];
    pthread_mutex_t mu;
    struct engine_proxy *proxies; /* under mu */
    int n_started;                /* under mu: numbers the sockets */
    atomic_int leases;
};

/* ---- the output a handler reads: filled here as the engine thread fills its own ---- */

static void output_apply(struct gen_output *o, struct engine_wire_event *e)
{
    struct gen_news *n = &e->news;
    pthread_mutex_lock(&o->mu);
    bool ok = true;
    if (n->text_len && n->text_from == o->text.len)
        ok = strbuf_append(&o->text, n->text, n->text_len);
    if (ok && n->n_tokens) {
        ok = strbuf_append(&o->tokens, (const char *)n->tokens, n->n_tokens * sizeof *n->tokens);
        if (ok)
            o->n_tokens += n->n_tokens;
    }
    if (ok && n->n_ids) {
        ok = strbuf_append(&o->ids, (const char *)n->ids, n->n_ids * sizeof *n->ids);
        if (ok)
            o->n_ids += n->n_ids;
    }
    o->n_prompt = n->n_prompt;
    o->n_cached = n->n_cached;
    o->n_generated = n->n_generated;
    o->t_admit_ns = n->t_admit_ns;
    o->spec = n->spec;
    if (o->finish == GEN_RUNNING && (!ok || n->finish != GEN_RUNNING)) {
        if (!ok) {
            o->finish = GEN_FINISH_ERROR;
            o->error_code = INFERD_ENOMEM;
            snprintf(o->error, sizeof o->error, "out of memory receiving the engine's tokens");
        } else {
            if (e->embedding) {
                o->embedding = e->embedding;
                o->n_embedding = e->n_embedding;
                e->embedding = NULL;
            }
            o->finish = n->finish;
            o->error_code = n->error_code;
            o->stop_string = n->stop_string;
            memcpy(o->error, n->error, sizeof o->error);
        }
    }
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void output_fail(struct gen_output *o, enum gen_finish finish, int code, const char *msg)
{
    pthread_mutex_lock(&o->mu);
    if (o->finish == GEN_RUNNING) {
        o->finish = finish;
        o->error_code = code;
        snprintf(o->error, sizeof o->error, "%s", msg);
    }
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/* ---- frames out ---- */

static int send_frame(struct engine_proxy *p, const struct strbuf *b)
{
    pthread_mutex_lock(&p->wmu);
    int fd = p->fd;
    size_t off = 0;
    while (fd >= 0 && off < b->len) {
        ssize_t k = send(fd, b->data + off, b->len - off, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        off += (size_t)k;
    }
    pthread_mutex_unlock(&p->wmu);
    return off == b->len && b->len ? 0 : -INFERD_EIO;
}

/* ---- the child ---- */

/* Forks and execs the child with the socket path last; its signals back to defaults, in a
 * process group of its own (a terminal's Ctrl-C is the supervisor's to handle), killed with
 * the supervisor, with no descriptor of the supervisor's but 0-2. */
static pid_t spawn_child(struct engine_proxy *p)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_UNBLOCK, &all, NULL);
    signal(SIGPIPE, SIG_DFL);
    setpgid(0, 0);
    /* Tied to the forking thread, the proxy thread, which outlives its children: it returns
     * only once the last one has been reaped. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    long max = sysconf(_SC_OPEN_MAX);
    for (int fd = 3; fd < (max > 0 && max < 65536 ? max : 65536); fd++)
        close(fd);
    execv(p->argv[0], p->argv);
    /* only async-signal-safe calls between fork and exec: another thread may hold stdio's lock */
    static const char msg[] = "inferd: engine child: exec of the inferd binary failed\n";
    ssize_t k = write(2, msg, sizeof msg - 1);
    (void)k;
    _exit(127);
}

static void describe_status(int status, char *buf, size_t cap)
{
    if (WIFSIGNALED(status))
        snprintf(buf, cap, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else if (WIFEXITED(status))
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
    else
        snprintf(buf, cap, "status 0x%x", status);
}

/* Reads the child's first frame, its HELLO, within the deadline (what follows it stays in
 * p->in); -INFERD_EIO when the child went away or said nothing in time. */
static int read_hello(struct engine_proxy *p, int fd, pid_t pid, uint64_t deadline,
                      struct engine_wire_hello *hello, struct err *err)
{
    struct strbuf *in = &p->in;
    strbuf_reset(in);
    int rc = -INFERD_EIO;
    for (;;) {
        struct engine_wire_frame f;
        size_t used = 0;
        int k = engine_wire_parse((const uint8_t *)in->data, in->len, &f, &used, err);
        if (k < 0) {
            rc = k;
            break;
        }
        if (k > 0) {
            rc = engine_wire_get_hello(&f, hello, err);
            strbuf_consume(in, used);
            break;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            char why[128];
            describe_status(status, why, sizeof why);
            rc = err_set(err, INFERD_EIO, "the engine child for %s %s while loading (its "
                         "messages are in the server's log)", p->id, why);
            pid = 0;
            break;
        }
        bool paused = atomic_load(&p->sup->leases) > 0;
        if (!paused && now_ns() > deadline) {
            rc = err_set(err, INFERD_EIO, "the engine child for %s sent no HELLO within %d s",
                         p->id, p->sup->cfg.start_timeout_s);
            break;
        }
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, POLL_MS) <= 0)
            continue;
        if (!strbuf_reserve(in, READ_CHUNK)) {
            rc = err_set(err, INFERD_ENOMEM, "out of memory reading the engine child's HELLO");
            break;
        }
        ssize_t n = read(fd, in->data + in->len, READ_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int status = 0;
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            pid = 0;
            char why[128];
            describe_status(status, why, sizeof why);
            rc = err_set(err, INFERD_EIO, "the engine child for %s %s while loading (its "
                         "messages are in the server's log)", p->id, why);
            break;
        }
        in->len += (size_t)n;
    }
    if (rc < 0 && pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return rc;
}

/* Starts a child and waits for its HELLO: 0 with p->fd and p->pid set (under mu and wmu). */
static int start_child(struct engine_proxy *p, struct err *err)
{
    uint64_t deadline = now_ns() + (uint64_t)p->sup->cfg.start_timeout_s * 1000000000ull;
    pid_t pid = spawn_child(p);
    if (pid < 0)
        return err_set(err, INFERD_EIO, "fork for the engine child of %s: %s", p->id,
                       strerror(errno));
    int fd = -1;
    for (;;) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            char why[128];
            describe_status(status, why, sizeof why);
            return err_set(err, INFERD_EIO, "the engine child for %s %s before it connected",
                           p->id, why);
        }
        pthread_mutex_lock(&p->mu);
        bool stopping = p->stopping;
        pthread_mutex_unlock(&p->mu);
        if (stopping || now_ns() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return err_set(err, INFERD_EIO, "the engine child for %s did not connect%s", p->id,
                           stopping ? " before the server stopped" : " in time");
        }
        struct pollfd pf = {.fd = p->listen_fd, .events = POLLIN};
        if (poll(&pf, 1, POLL_MS) <= 0)
            continue;
        fd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        struct ucred cred;
        socklen_t len = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid == pid)
            break;
        close(fd); /* not our child: whoever it is gets nothing */
        fd = -1;
    }
    struct engine_wire_hello hello;
    int rc = read_hello(p, fd, pid, deadline, &hello, err);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    if (atomic_load(&p->sup->leases) > 0)
        kill(pid, SIGSTOP);
    pthread_mutex_lock(&p->wmu);
    pthread_mutex_lock(&p->mu);
    p->fd = fd;
    p->pid = pid;
    p->hello = hello;
    p->cfg = hello.cfg;
    p->cfg.tier = hello.has_tier ? &p->tier_mark : NULL;
    p->spec_mark.kind = (enum spec_kind)hello.spec_kind;
    p->cfg.spec = &p->spec_mark;
    p->state = PROXY_RUNNING;
    p->progress_ns = now_ns();
    p->paused = atomic_load(&p->sup->leases) > 0;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->wmu);
    log_info("serve: engine child for %s running (pid %d, %s)", p->id, (int)pid, p->socket);
    return 0;
}

/* The child is gone (or killed): every request on it finishes with why, every waiting call
 * gets -INFERD_EBUSY, every waiting submit -INFERD_EIO, and the connection closes. */
static void child_lost(struct engine_proxy *p, bool stopping, const char *why)
{
    pthread_mutex_lock(&p->wmu);
    pthread_mutex_lock(&p->mu);
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
    p->pid = 0;
    p->paused = false;
    struct request *r = p->reqs;
    p->reqs = NULL;
    p->n_reqs = 0;
    for (struct call_wait *c = p->calls; c; c = c->next) {
        c->done = true;
        c->reply->rc = -INFERD_EBUSY;
        snprintf(c->reply->msg, sizeof c->reply->msg, "%s", why);
    }
    p->calls = NULL;
    p->state = stopping ? PROXY_STOPPED : PROXY_RESTARTING;
    while (r) {
        struct request *next = r->next;
        if (r->wait) {
            r->wait->done = true;
            r->wait->rc = -INFERD_EIO;
            snprintf(r->wait->msg, sizeof r->wait->msg, "%s", why);
        }
        output_fail(r->out, stopping ? GEN_FINISH_CANCELLED : GEN_FINISH_ERROR, INFERD_EBUSY, why);
        gen_output_release(r->out);
        free(r);
        r = next;
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->wmu);
}

static struct request *find_request(struct engine_proxy *p, uint64_t id, struct request ***link)
{
    struct request **l = &p->reqs;
    for (; *l; l = &(*l)->next)
        if ((*l)->id == id) {
            if (link)
                *link = l;
            return *l;
        }
    return NULL;
}

static void unlink_request(struct engine_proxy *p, struct request **link)
{
    struct request *r = *link;
    *link = r->next;
    p->n_reqs--;
    gen_output_release(r->out);
    free(r);
}

/* One frame from the child; false when it breaks the protocol. */
static bool handle_frame(struct engine_proxy *p, const struct engine_wire_frame *f)
{
    struct err err = {0};
    uint64_t now = now_ns();
    switch (f->type) {
    case ENGINE_WIRE_SUBMITTED: {
        struct engine_wire_submitted s;
        if (engine_wire_get_submitted(f, &s, &err) < 0)
            break;
        pthread_mutex_lock(&p->mu);
        struct request **link = NULL;
        struct request *r = find_request(p, s.id, &link);
        if (r && r->wait) {
            r->wait->done = true;
            r->wait->rc = s.rc;
            snprintf(r->wait->msg, sizeof r->wait->msg, "%s", s.msg);
            r->wait = NULL;
            if (s.rc < 0)
                unlink_request(p, link);
            pthread_cond_broadcast(&p->cv);
        }
        pthread_mutex_unlock(&p->mu);
        return true;
    }
    case ENGINE_WIRE_EVENT: {
        struct engine_wire_event e;
        if (engine_wire_get_event(f, &e, &err) < 0) {
            engine_wire_event_free(&e);
            break;
        }
        pthread_mutex_lock(&p->mu);
        p->progress_ns = now;
        struct request **link = NULL;
        struct request *r = find_request(p, e.id, &link);
        if (r) {
            output_apply(r->out, &e);
            if (e.news.t_admit_ns && !r->t_admit_ns) {
                r->t_admit_ns = e.news.t_admit_ns;
                uint64_t queued =
                    r->t_admit_ns > r->t_submit_ns ? r->t_admit_ns - r->t_submit_ns : 0;
                histogram_observe(&p->metrics.queue_time, (double)queued * 1e-9);
            }
            if (e.news.n_generated > 0) {
                if (!r->got_token) {
                    histogram_observe(&p->metrics.ttft, (double)(now - r->t_submit_ns) * 1e-9);
                    if (r->t_admit_ns && now > r->t_admit_ns)
                        histogram_observe(&p->metrics.prefill_time,
                                          (double)(now - r->t_admit_ns) * 1e-9);
                } else if (e.news.n_ids > 0) {
                    histogram_observe(&p->metrics.inter_token,
                                      (double)(now - r->t_last_ns) * 1e-9 / (double)e.news.n_ids);
                }
                r->got_token = true;
                r->t_last_ns = now;
            }
            if (e.news.finish != GEN_RUNNING)
                unlink_request(p, link);
        }
        pthread_mutex_unlock(&p->mu);
        engine_wire_event_free(&e);
        return true;
    }
    case ENGINE_WIRE_REPLY: {
        struct engine_wire_reply *rep = malloc(sizeof *rep);
        if (!rep || engine_wire_get_reply(f, rep, &err) < 0) {
            if (rep)
                engine_wire_reply_free(rep);
            free(rep);
            break;
        }
        pthread_mutex_lock(&p->mu);
        p->last_stats = rep->stats;
        snprintf(p->spec_kind, sizeof p->spec_kind, "%s", rep->spec_kind);
        snprintf(p->state_text, sizeof p->state_text, "%s", rep->state);
        snprintf(p->ssd_dir, sizeof p->ssd_dir, "%s", rep->ssd_dir);
        for (struct call_wait **l = &p->calls; *l; l = &(*l)->next)
            if ((*l)->id == rep->call) {
                struct call_wait *c = *l;
                *c->reply = *rep; /* the lists move to the caller */
                rep->adapters = NULL;
                rep->found = NULL;
                c->done = true;
                *l = c->next;
                break;
            }
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        engine_wire_reply_free(rep);
        free(rep);
        return true;
    }
    case ENGINE_WIRE_PROGRESS: {
        struct engine_wire_progress pr;
        if (engine_wire_get_progress(f, &pr, &err) < 0)
            break;
        pthread_mutex_lock(&p->mu);
        if (pr.steps != p->steps || pr.active == 0)
            p->progress_ns = now;
        p->steps = pr.steps;
        pthread_mutex_unlock(&p->mu);
        return true;
    }
    default:
        err_set(&err, INFERD_EFORMAT, "engine frame type %u is not the child's to send", f->type);
        break;
    }
    log_error("serve: engine child for %s: %s", p->id, err.msg);
    return false;
}

/* Sends CANCEL for every request whose reader asked to stop. */
static void sweep_cancels(struct engine_proxy *p)
{
    uint64_t ids[64];
    int n = 0;
    pthread_mutex_lock(&p->mu);
    for (struct request *r = p->reqs; r && n < 64; r = r->next)
        if (!r->cancel_sent && atomic_load(&r->out->cancel)) {
            r->cancel_sent = true;
            ids[n++] = r->id;
        }
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < n; i++) {
        struct strbuf b = {0};
        if (engine_wire_put_cancel(&b, ids[i]))
            send_frame(p, &b);
        strbuf_free(&b);
    }
}

/* Waits until another restart is allowed: at most max_restarts starts within
 * restart_window_s (a model that crashes as it loads does not spin). */
static void restart_backoff(struct engine_proxy *p)
{
    const struct engine_supervisor_config *c = &p->sup->cfg;
    int max = c->max_restarts < MAX_RESTART_HISTORY ? c->max_restarts : MAX_RESTART_HISTORY;
    if (max <= 0)
        return;
    uint64_t window = (uint64_t)c->restart_window_s * 1000000000ull;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int recent = 0;
        uint64_t now = now_ns();
        for (int i = 0; i < MAX_RESTART_HISTORY; i++)
            if (p->restart_ns[i] && now - p->restart_ns[i] < window)
                recent++;
        bool stopping = p->stopping;
        pthread_mutex_unlock(&p->mu);
        if (stopping || recent < max)
            return;
        usleep(POLL_MS * 1000);
    }
}

/* Serves one connected child until it is lost; returns true when the proxy is stopping. */
static bool serve_child(struct engine_proxy *p)
{
    struct strbuf in = p->in; /* what came after the HELLO */
    p->in = (struct strbuf){0};
    bool pending = in.len > 0; /* frames that came with the HELLO: parsed before any read */
    bool shut = false;
    bool stopping = false;
    char why[512] = "";
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int fd = p->fd;
        pid_t pid = p->pid;
        stopping = p->stopping;
        uint64_t deadline = p->stop_deadline_ns;
        bool watch = !stopping && p->n_reqs > 0 && !p->paused && p->sup->cfg.watchdog_s > 0;
        uint64_t idle = now_ns() - p->progress_ns;
        pthread_mutex_unlock(&p->mu);
        if (stopping && !shut) {
            /* the child reads end-of-file and stops (also one started as the server stopped) */
            pthread_mutex_lock(&p->wmu);
            shutdown(fd, SHUT_WR);
            pthread_mutex_unlock(&p->wmu);
            shut = true;
        }
        if (stopping && now_ns() > deadline) {
            kill(pid, SIGKILL);
            snprintf(why, sizeof why, "the server is stopping");
            waitpid(pid, NULL, 0);
            break;
        }
        if (watch && idle > (uint64_t)p->sup->cfg.watchdog_s * 1000000000ull) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            snprintf(why, sizeof why, "the engine for %s hung (no step progress in %d s) and "
                     "was restarted", p->id, p->sup->cfg.watchdog_s);
            pthread_mutex_lock(&p->mu);
            p->hangs++;
            pthread_mutex_unlock(&p->mu);
            log_error("serve: engine child for %s (pid %d) made no step progress in %d s with "
                      "requests waiting: killed", p->id, (int)pid, p->sup->cfg.watchdog_s);
            break;
        }
        sweep_cancels(p);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int k = pending ? 0 : poll(&pf, 1, POLL_MS);
        ssize_t n = 0;
        if (k > 0) {
            if (!strbuf_reserve(&in, READ_CHUNK))
                n = -1;
            else
                n = read(fd, in.data + in.len, READ_CHUNK);
            if (n < 0 && errno == EINTR)
                continue;
        }
        int status = 0;
        bool exited = waitpid(pid, &status, WNOHANG) == pid;
        if (n > 0 || pending) {
            in.len += n > 0 ? (size_t)n : 0;
            pending = false;
            size_t off = 0;
            bool bad = false;
            for (;;) {
                struct engine_wire_frame f;
                size_t used = 0;
                struct err err = {0};
                int r = engine_wire_parse((const uint8_t *)in.data + off, in.len - off, &f,
                                          &used, &err);
                if (r < 0) {
                    log_error("serve: engine child for %s: %s", p->id, err.msg);
                    bad = true;
                }
                if (r <= 0)
                    break;
                if (!handle_frame(p, &f)) {
                    bad = true;
                    break;
                }
                off += used;
            }
            strbuf_consume(&in, off);
            if (bad) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                snprintf(why, sizeof why, "the engine for %s broke the protocol and was "
                         "restarted", p->id);
                break;
            }
            if (!exited)
                continue;
        }
        if (n < 0 || (k > 0 && n == 0) || exited) {
            if (!exited) {
                /* EOF: the child is exiting; one that lingers (past the stop's deadline, or
                 * two seconds) is killed. */
                uint64_t until = now_ns() + 2000000000ull;
                while (waitpid(pid, &status, WNOHANG) != pid) {
                    pthread_mutex_lock(&p->mu);
                    if (p->stopping && p->stop_deadline_ns > until)
                        until = p->stop_deadline_ns;
                    pthread_mutex_unlock(&p->mu);
                    if (now_ns() > until) {
                        kill(pid, SIGKILL);
                        waitpid(pid, &status, 0);
                        break;
                    }
                    usleep(10000);
                }
            }
            pthread_mutex_lock(&p->mu);
            stopping = p->stopping;
            pthread_mutex_unlock(&p->mu);
            char st[128];
            describe_status(status, st, sizeof st);
            if (stopping) {
                snprintf(why, sizeof why, "the server is stopping");
                log_info("serve: engine child for %s %s", p->id, st);
            } else {
                snprintf(why, sizeof why, "the engine for %.200s crashed (%s) and was restarted",
                         p->id, st);
                pthread_mutex_lock(&p->mu);
                p->crashes++;
                pthread_mutex_unlock(&p->mu);
                log_error("serve: engine child for %s (pid %d) %s", p->id, (int)pid, st);
            }
            break;
        }
    }
    strbuf_free(&in);
    child_lost(p, stopping, why);
    return stopping;
}

static void *proxy_run(void *arg)
{
    struct engine_proxy *p = arg;
    int attempts = 0;
    for (bool first = true;; first = false) {
        if (!first)
            restart_backoff(p);
        struct err err = {0};
        int rc = start_child(p, &err);
        pthread_mutex_lock(&p->mu);
        if (!first)
            p->restart_ns[attempts++ % MAX_RESTART_HISTORY] = now_ns();
        if (rc < 0 && (first || p->stopping)) {
            if (first) {
                p->start_rc = rc;
                p->start_err = err;
            }
            p->started_once = true;
            p->state = PROXY_STOPPED;
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        if (rc < 0) {
            pthread_mutex_unlock(&p->mu);
            log_error("serve: restarting the engine for %s: %s", p->id, err.msg);
            continue;
        }
        if (!first)
            p->restarts++;
        p->started_once = true;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        if (serve_child(p))
            return NULL;
    }
}

/* ---- the supervisor ---- */

int engine_supervisor_create(const struct engine_supervisor_config *cfg,
                             struct engine_supervisor **out, struct err *err)
{
    struct engine_supervisor *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(err, INFERD_ENOMEM, "out of memory for the engine supervisor");
    s->cfg = *cfg;
    snprintf(s->exe, sizeof s->exe, "%s", cfg->exe);
    snprintf(s->runtime_dir, sizeof s->runtime_dir, "%s", cfg->runtime_dir);
    s->cfg.exe = s->exe;
    s->cfg.runtime_dir = s->runtime_dir;
    if (s->cfg.start_timeout_s <= 0)
        s->cfg.start_timeout_s = 600;
    pthread_mutex_init(&s->mu, NULL);
    atomic_init(&s->leases, 0);
    *out = s;
    return 0;
}

void engine_supervisor_free(struct engine_supervisor *s)
{
    if (!s)
        return;
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void engine_supervisor_each(struct engine_supervisor *s,
                            void (*fn)(void *ctx, struct engine_proxy *p), void *ctx)
{
    pthread_mutex_lock(&s->mu);
    for (struct engine_proxy *p = s->proxies; p; p = p->next)
        fn(ctx, p);
    pthread_mutex_unlock(&s->mu);
}

int engine_supervisor_watchdog_s(const struct engine_supervisor *s)
{
    return s->cfg.watchdog_s;
}

static void set_paused(struct engine_supervisor *s, bool pause)
{
    for (struct engine_proxy *p = s->proxies; p; p = p->next) {
        pthread_mutex_lock(&p->mu);
        if (p->pid > 0 && p->paused != pause) {
            kill(p->pid, pause ? SIGSTOP : SIGCONT);
            p->paused = pause;
        }
        if (!pause)
            p->progress_ns = now_ns(); /* paused time is no hang */
        pthread_mutex_unlock(&p->mu);
    }
}

void engine_supervisor_lease(struct engine_supervisor *s)
{
    pthread_mutex_lock(&s->mu);
    if (atomic_fetch_add(&s->leases, 1) == 0)
        set_paused(s, true);
    pthread_mutex_unlock(&s->mu);
}

void engine_supervisor_unlease(struct engine_supervisor *s)
{
    pthread_mutex_lock(&s->mu);
    if (atomic_fetch_sub(&s->leases, 1) == 1)
        set_paused(s, false);
    pthread_mutex_unlock(&s->mu);
}

int engine_supervisor_leases(struct engine_supervisor *s)
{
    return atomic_load(&s->leases);
}

/* ---- a proxy ---- */

static int listen_at(const char *path, struct err *err)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path)
        return err_set(err, INFERD_ERANGE, "socket path %s is longer than %zu bytes", path,
                       sizeof a.sun_path - 1);
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return err_set(err, INFERD_EIO, "socket: %s", strerror(errno));
    unlink(path);
    mode_t old = umask(0077); /* the engine's socket is the supervisor's alone */
    int rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    umask(old);
    if (rc < 0 || listen(fd, 4) < 0) {
        int e = errno;
        close(fd);
        return err_set(err, INFERD_EIO, "listening on %s: %s", path, strerror(e));
    }
    return fd;
}

static void proxy_free(struct engine_proxy *p)
{
    if (p->listen_fd >= 0) {
        close(p->listen_fd);
        unlink(p->socket);
    }
    strbuf_free(&p->in);
    if (p->argv)
        for (char **a = p->argv; *a; a++)
            free(*a);
    free(p->argv);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->wmu);
    free(p);
}

int engine_proxy_start(struct engine_supervisor *s, const char *id, const char *const *args,
                       int n_args, struct engine_wire_hello *hello, struct engine_proxy **out,
                       struct err *err)
{
    *out = NULL;
    struct engine_proxy *p = calloc(1, sizeof *p);
    if (!p)
        return err_set(err, INFERD_ENOMEM, "out of memory for the engine proxy of %s", id);
    p->sup = s;
    p->fd = -1;
    p->listen_fd = -1;
    snprintf(p->id, sizeof p->id, "%s", id);
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->wmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    histogram_init_latency(&p->metrics.ttft);
    histogram_init_latency(&p->metrics.inter_token);
    histogram_init_latency(&p->metrics.queue_time);
    histogram_init_latency(&p->metrics.prefill_time);
    snprintf(p->spec_kind, sizeof p->spec_kind, "none");
    snprintf(p->state_text, sizeof p->state_text, "starting");
    pthread_mutex_lock(&s->mu);
    int n = s->n_started++;
    pthread_mutex_unlock(&s->mu);
    if (snprintf(p->socket, sizeof p->socket, "%s/inferd-%d-engine-%d.sock", s->runtime_dir,
                 (int)getpid(), n) >= (int)sizeof p->socket) {
        proxy_free(p);
        return err_set(err, INFERD_ERANGE, "the runtime directory %s makes too long a socket "
                       "path", s->runtime_dir);
    }
    int rc = listen_at(p->socket, err);
    if (rc < 0) {
        proxy_free(p);
        return rc;
    }
    p->listen_fd = rc;
    p->argv = calloc((size_t)n_args + 3, sizeof *p->argv);
    if (!p->argv) {
        proxy_free(p);
        return err_set(err, INFERD_ENOMEM, "out of memory for the engine proxy of %s", id);
    }
    bool ok = (p->argv[0] = strdup(s->exe)) != NULL;
    for (int i = 0; ok && i < n_args; i++)
        ok = (p->argv[1 + i] = strdup(args[i])) != NULL;
    ok = ok && (p->argv[1 + n_args] = strdup(p->socket)) != NULL;
    if (!ok) {
        proxy_free(p);
        return err_set(err, INFERD_ENOMEM, "out of memory for the engine proxy of %s", id);
    }
    if (pthread_create(&p->thread, NULL, proxy_run, p) != 0) {
        proxy_free(p);
        return err_set(err, INFERD_EIO, "cannot start the engine proxy thread of %s", id);
    }
    p->thread_started = true;
    pthread_mutex_lock(&p->mu);
    while (p->state == PROXY_STARTING && !p->started_once)
        pthread_cond_wait(&p->cv, &p->mu);
    rc = p->start_rc;
    if (rc < 0)
        *err = p->start_err;
    else
        *hello = p->hello;
    pthread_mutex_unlock(&p->mu);
    if (rc < 0) {
        pthread_join(p->thread, NULL);
        proxy_free(p);
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    p->next = s->proxies;
    s->proxies = p;
    if (atomic_load(&s->leases) > 0 && !p->paused) {
        pthread_mutex_lock(&p->mu);
        if (p->pid > 0)
            kill(p->pid, SIGSTOP);
        p->paused = true;
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&s->mu);
    *out = p;
    return 0;
}

void engine_proxy_shutdown(struct engine_proxy *p, int grace_ms)
{
    if (!p || !p->thread_started)
        return;
    struct engine_supervisor *s = p->sup;
    pthread_mutex_lock(&s->mu);
    for (struct engine_proxy **l = &s->proxies; *l; l = &(*l)->next)
        if (*l == p) {
            *l = p->next;
            break;
        }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    p->stop_deadline_ns = now_ns() + (uint64_t)(grace_ms > 0 ? grace_ms : 0) * 1000000ull +
                          5000000000ull; /* the child's own grace, then its tier's flush */
    if (p->paused && p->pid > 0)
        kill(p->pid, SIGCONT);
    p->paused = false;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    /* The child reads end-of-file: it stops admitting, finishes what it runs, and exits. */
    pthread_mutex_lock(&p->wmu);
    if (p->fd >= 0)
        shutdown(p->fd, SHUT_WR);
    pthread_mutex_unlock(&p->wmu);
    pthread_join(p->thread, NULL);
    p->thread_started = false;
}

void engine_proxy_free(struct engine_proxy *p)
{
    if (!p)
        return;
    engine_proxy_shutdown(p, 0);
    proxy_free(p);
}

/* Waits (mu held) until the child runs; false when it does not within the start timeout or
 * the proxy is stopping. */
static bool wait_running(struct engine_proxy *p)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += p->sup->cfg.start_timeout_s;
    while (p->state != PROXY_RUNNING && !p->stopping && p->state != PROXY_STOPPED)
        if (pthread_cond_timedwait(&p->cv, &p->mu, &until) == ETIMEDOUT)
            break;
    return p->state == PROXY_RUNNING && !p->stopping;
}

int engine_proxy_submit(struct engine_proxy *p, const struct gen_params *params,
                        const struct structured_spec *grammar, const char *adapter,
                        struct gen_output **out, struct err *err)
{
    *out = NULL;
    struct gen_output *o = gen_output_create(params->n_prompt);
    struct request *r = calloc(1, sizeof *r);
    if (!o || !r) {
        free(o);
        free(r);
        return err_set(err, INFERD_ENOMEM, "out of memory queueing a request");
    }
    struct submit_wait w = {0};
    pthread_mutex_lock(&p->mu);
    if (!wait_running(p)) {
        pthread_mutex_unlock(&p->mu);
        gen_output_release(o);
        gen_output_release(o);
        free(r);
        return err_set(err, INFERD_EIO, "the engine for %s is %s", p->id,
                       p->stopping ? "stopping" : "restarting");
    }
    r->id = ++p->next_id;
    r->out = o;
    r->wait = &w;
    r->t_submit_ns = now_ns();
    if (p->n_reqs == 0)
        p->progress_ns = r->t_submit_ns; /* an idle engine's old step count is no hang */
    r->next = p->reqs;
    p->reqs = r;
    p->n_reqs++;
    uint64_t id = r->id;
    pthread_mutex_unlock(&p->mu);

    struct strbuf b = {0};
    bool encoded = engine_wire_put_submit(&b, id, params, grammar, adapter);
    if (encoded)
        send_frame(p, &b); /* a failed send means a lost child: child_lost answers w */
    strbuf_free(&b);
    pthread_mutex_lock(&p->mu);
    if (!encoded) {
        struct request **link = NULL;
        if (find_request(p, id, &link))
            unlink_request(p, link);
        w.done = true;
        w.rc = -INFERD_ENOMEM;
        snprintf(w.msg, sizeof w.msg, "out of memory encoding a request for the engine");
    }
    while (!w.done)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    if (w.rc < 0) {
        gen_output_release(o);
        return err_set(err, -w.rc, "%s", w.msg);
    }
    *out = o;
    return 0;
}

/* Sends a call and waits for its reply; -INFERD_EBUSY when the child is down or lost. */
static int proxy_call(struct engine_proxy *p, struct engine_wire_call *c,
                      struct engine_wire_reply *reply, struct err *err)
{
    memset(reply, 0, sizeof *reply);
    struct call_wait w = {.reply = reply};
    pthread_mutex_lock(&p->mu);
    if (p->state != PROXY_RUNNING || p->stopping) {
        pthread_mutex_unlock(&p->mu);
        return err_set(err, INFERD_EBUSY, "the engine for %s is %s", p->id,
                       p->stopping ? "stopping" : "restarting");
    }
    w.id = c->call = ++p->next_id;
    w.next = p->calls;
    p->calls = &w;
    pthread_mutex_unlock(&p->mu);
    struct strbuf b = {0};
    bool ok = engine_wire_put_call(&b, c) && send_frame(p, &b) == 0;
    strbuf_free(&b);
    pthread_mutex_lock(&p->mu);
    if (!ok && !w.done) {
        for (struct call_wait **l = &p->calls; *l; l = &(*l)->next)
            if (*l == &w) {
                *l = w.next;
                break;
            }
        w.done = true;
        reply->rc = -INFERD_EBUSY;
        snprintf(reply->msg, sizeof reply->msg, "the engine for %s is restarting", p->id);
    }
    while (!w.done)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    if (reply->rc < 0)
        return err_set(err, -reply->rc, "%s", reply->msg);
    return 0;
}

const struct engine_config *engine_proxy_config(const struct engine_proxy *p)
{
    return &p->cfg;
}

void engine_proxy_stats(struct engine_proxy *p, struct engine_stats *out)
{
    pthread_mutex_lock(&p->mu);
    bool paused = p->paused; /* a paused child answers nothing: reports take the last stats */
    pthread_mutex_unlock(&p->mu);
    struct engine_wire_reply *rep = paused ? NULL : malloc(sizeof *rep);
    struct engine_wire_call c = {.kind = ENGINE_CALL_STATS};
    struct err err = {0};
    bool live = rep && proxy_call(p, &c, rep, &err) == 0;
    free(rep);
    pthread_mutex_lock(&p->mu);
    *out = p->last_stats;
    out->spec_kind = p->spec_kind;
    out->state = live ? p->state_text : p->paused ? "paused" : state_names[p->state];
    out->ssd_cache.store.dir = p->ssd_dir[0] ? p->ssd_dir : NULL;
    pthread_mutex_unlock(&p->mu);
}

const struct engine_metrics *engine_proxy_metrics(const struct engine_proxy *p)
{
    return &p->metrics;
}

int engine_proxy_close_session(struct engine_proxy *p, const char *session_id,
                               int *blocks_released, struct err *err)
{
    struct engine_wire_reply *rep = malloc(sizeof *rep);
    if (!rep)
        return err_set(err, INFERD_ENOMEM, "out of memory");
    struct engine_wire_call c = {.kind = ENGINE_CALL_CLOSE_SESSION};
    snprintf(c.session, sizeof c.session, "%s", session_id);
    int rc = proxy_call(p, &c, rep, err);
    *blocks_released = rc == 0 ? rep->result : -1;
    free(rep);
    return rc;
}

int engine_proxy_flush(struct engine_proxy *p, int timeout_ms, struct kv_tier_stats *after,
                       struct err *err)
{
    struct engine_wire_reply *rep = malloc(sizeof *rep);
    if (!rep)
        return err_set(err, INFERD_ENOMEM, "out of memory");
    struct engine_wire_call c = {.kind = ENGINE_CALL_FLUSH, .timeout_ms = timeout_ms};
    int rc = proxy_call(p, &c, rep, err);
    if (after) {
        *after = rep->tier;
        pthread_mutex_lock(&p->mu);
        after->store.dir = p->ssd_dir[0] ? p->ssd_dir : NULL;
        pthread_mutex_unlock(&p->mu);
    }
    free(rep);
    return rc;
}

/* An adapter call: the reply (its lists the caller's to free) filled, or an error. */
static int adapter_call(struct engine_proxy *p, enum engine_wire_call_kind kind, const char *id,
                        const char *path, struct engine_wire_reply **out, struct err *err)
{
    *out = NULL;
    struct engine_wire_reply *rep = malloc(sizeof *rep);
    if (!rep)
        return err_set(err, INFERD_ENOMEM, "out of memory");
    struct engine_wire_call c = {.kind = kind};
    if (id && snprintf(c.adapter_id, sizeof c.adapter_id, "%s", id) >= (int)sizeof c.adapter_id) {
        free(rep);
        return err_set(err, INFERD_EINVAL, "adapter id '%.40s...' is too long", id);
    }
    if (path && snprintf(c.path, sizeof c.path, "%s", path) >= (int)sizeof c.path) {
        free(rep);
        return err_set(err, INFERD_EINVAL, "adapter path is longer than %zu bytes",
                       sizeof c.path - 1);
    }
    int rc = proxy_call(p, &c, rep, err);
    if (rc < 0) {
        engine_wire_reply_free(rep);
        free(rep);
        return rc;
    }
    *out = rep;
    return 0;
}

static void reply_drop(struct engine_wire_reply *rep)
{
    if (rep)
        engine_wire_reply_free(rep);
    free(rep);
}

int engine_proxy_adapter_list(struct engine_proxy *p, struct adapter_info *out, int cap,
                              struct err *err)
{
    struct engine_wire_reply *rep;
    int rc = adapter_call(p, ENGINE_CALL_ADAPTERS, NULL, NULL, &rep, err);
    if (rc < 0)
        return rc;
    int n = rep->n_adapters;
    if (n > 0)
        memcpy(out, rep->adapters, (size_t)(n < cap ? n : cap) * sizeof *out);
    reply_drop(rep);
    return n;
}

int engine_proxy_adapter_available(struct engine_proxy *p, struct adapter_found *out, int cap,
                                   struct err *err)
{
    struct engine_wire_reply *rep;
    int rc = adapter_call(p, ENGINE_CALL_ADAPTERS_AVAILABLE, NULL, NULL, &rep, err);
    if (rc < 0)
        return rc;
    int n = rep->n_found;
    if (n > 0)
        memcpy(out, rep->found, (size_t)(n < cap ? n : cap) * sizeof *out);
    reply_drop(rep);
    return n;
}

int engine_proxy_adapter_mount(struct engine_proxy *p, const char *id, const char *path,
                               struct adapter_info *info, struct err *err)
{
    struct engine_wire_reply *rep;
    int rc = adapter_call(p, ENGINE_CALL_ADAPTER_MOUNT, id, path, &rep, err);
    if (rc < 0)
        return rc;
    if (rep->n_adapters != 1)
        rc = err_set(err, INFERD_EIO, "the engine for %s answered a mount without the adapter",
                     p->id);
    else if (info)
        *info = rep->adapters[0];
    reply_drop(rep);
    return rc;
}

int engine_proxy_adapter_unmount(struct engine_proxy *p, const char *id, int *removed_modules,
                                 struct err *err)
{
    struct engine_wire_reply *rep;
    int rc = adapter_call(p, ENGINE_CALL_ADAPTER_UNMOUNT, id, NULL, &rep, err);
    if (rc < 0)
        return rc;
    *removed_modules = rep->result;
    reply_drop(rep);
    return 0;
}

void engine_proxy_info(struct engine_proxy *p, struct engine_proxy_info *out)
{
    pthread_mutex_lock(&p->mu);
    snprintf(out->id, sizeof out->id, "%s", p->id);
    out->pid = p->pid;
    out->restarts = p->restarts;
    out->crashes = p->crashes;
    out->hangs = p->hangs;
    snprintf(out->socket, sizeof out->socket, "%s", p->socket);
    out->state = state_names[p->state];
    out->in_flight = p->n_reqs;
    out->paused = p->paused;
    pthread_mutex_unlock(&p->mu);
}

/* ---- a served model's engine ---- */

bool served_engine_ready(const struct served_model *sm)
{
    return sm && (sm->engine || sm->proxy);
}

int served_engine_submit(const struct served_model *sm, const struct gen_params *params,
                         const char *adapter, const struct structured_spec *grammar,
                         struct gen_output **out, struct err *err)
{
    if (sm->proxy)
        return engine_proxy_submit(sm->proxy, params, grammar, adapter, out, err);
    /* the adapters' references are held until the sequence has taken its own (the engine
     * mixes their digests into the cache namespace) */
    struct gen_params p = *params;
    int rc = adapter_resolve(sm->adapters, adapter, &p, err);
    if (rc < 0)
        return -INFERD_ENOENT;
    rc = engine_submit(sm->engine, &p, out, err);
    adapter_put(&p);
    return rc;
}

const struct engine_config *served_engine_config(const struct served_model *sm)
{
    if (!sm)
        return NULL;
    if (sm->proxy)
        return engine_proxy_config(sm->proxy);
    return sm->engine ? engine_config(sm->engine) : NULL;
}

void served_engine_stats(const struct served_model *sm, struct engine_stats *out)
{
    if (sm->proxy)
        engine_proxy_stats(sm->proxy, out);
    else
        engine_get_stats(sm->engine, out);
}

const struct engine_metrics *served_engine_metrics(const struct served_model *sm)
{
    return sm->proxy ? engine_proxy_metrics(sm->proxy) : engine_metrics(sm->engine);
}

int served_engine_close_session(const struct served_model *sm, const char *session_id,
                                int *blocks_released, struct err *err)
{
    if (sm->proxy)
        return engine_proxy_close_session(sm->proxy, session_id, blocks_released, err);
    return engine_close_session(sm->engine, session_id, blocks_released, err);
}

int served_engine_flush(const struct served_model *sm, int timeout_ms, struct kv_tier_stats *after,
                        struct err *err)
{
    if (sm->proxy)
        return engine_proxy_flush(sm->proxy, timeout_ms, after, err);
    return engine_flush_cache(sm->engine, timeout_ms, after, err);
}

/* ---- a served model's adapters, in process or in a child ---- */

bool served_adapters_ready(const struct served_model *sm)
{
    if (sm->proxy) {
        pthread_mutex_lock(&sm->proxy->mu);
        bool has = sm->proxy->hello.has_adapters;
        pthread_mutex_unlock(&sm->proxy->mu);
        return has;
    }
    return sm->adapters != NULL;
}

int served_adapters_list(const struct served_model *sm, struct adapter_info *out, int cap,
                         struct err *err)
{
    if (sm->proxy)
        return engine_proxy_adapter_list(sm->proxy, out, cap, err);
    return adapter_list(sm->adapters, out, cap);
}

int served_adapters_available(const struct served_model *sm, struct adapter_found *out, int cap,
                              struct err *err)
{
    if (sm->proxy)
        return engine_proxy_adapter_available(sm->proxy, out, cap, err);
    return adapter_available(sm->adapters, out, cap);
}

int served_adapters_mount(const struct served_model *sm, const char *id, const char *path,
                          struct adapter_info *info, struct err *err)
{
    if (sm->proxy)
        return engine_proxy_adapter_mount(sm->proxy, id, path, info, err);
    return adapter_mount(sm->adapters, id, path, info, err);
}

int served_adapters_unmount(const struct served_model *sm, const char *id, int *removed_modules,
                            struct err *err)
{
    if (sm->proxy)
        return engine_proxy_adapter_unmount(sm->proxy, id, removed_modules, err);
    return adapter_unmount(sm->adapters, id, removed_modules, err);
}
