/* api/engine_child.c — the engine child's loop: the main thread reads the supervisor's frames
 * and sends step progress; each request has a thread that drains its output into EVENT frames;
 * calls (a flush may take long) run on threads of their own. */
#include "api/engine_child.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "base/timer.h"
#include "engine/adapters.h"

#define POLL_MS 100
#define PROGRESS_EVERY_NS 500000000ull
#define DRAIN_WAIT_MS 200
#define READ_CHUNK (64 * 1024)

struct child;

struct child_request {
    struct child *c;
    struct engine_wire_submit s; /* the decoded request; its arrays live as long as this */
    struct gen_output *out;      /* the engine's; one reference */
    struct child_request *next;
};

struct child {
    int fd;
    struct served_model *sm;
    const struct engine_child_hooks *hooks;
    pthread_mutex_t wmu; /* one frame writer at a time */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct child_request *reqs; /* under mu */
    int n_threads;              /* under mu: request and call threads still running */
};

static void send_frame(struct child *c, const struct strbuf *b)
{
    pthread_mutex_lock(&c->wmu);
    size_t off = 0;
    while (off < b->len) {
        ssize_t k = send(c->fd, b->data + off, b->len - off, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break; /* the supervisor is gone: the main loop sees it too */
        off += (size_t)k;
    }
    pthread_mutex_unlock(&c->wmu);
}

static void thread_done(struct child *c)
{
    pthread_mutex_lock(&c->mu);
    c->n_threads--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* A test fault, where a hook asks for one. */
static void maybe_fault(struct child *c, struct child_request *r, int n_generated)
{
    if (!c->hooks || !c->hooks->fault)
        return;
    switch (c->hooks->fault(c->hooks->ctx, &r->s.p, n_generated)) {
    case ENGINE_FAULT_CRASH:
        log_error("engine child: test fault: crashing");
        abort();
    case ENGINE_FAULT_HANG:
        log_error("engine child: test fault: hanging");
        pthread_mutex_lock(&c->wmu); /* nothing is sent any more, progress included */
        for (;;)
            pause();
    case ENGINE_FAULT_NONE:
        break;
    }
}

static void *request_run(void *arg)
{
    struct child_request *r = arg;
    struct child *c = r->c;
    struct gen_cursor cur = {0};
    int last_generated = -1;
    for (;;) {
        struct gen_news n;
        if (gen_output_drain(r->out, &cur, DRAIN_WAIT_MS, &n) < 0) {
            atomic_store(&r->out->cancel, true);
            continue;
        }
        bool news = n.text_len || n.n_tokens || n.n_ids || n.finish != GEN_RUNNING ||
                    n.n_generated != last_generated;
        if (news) {
            const float *emb = NULL;
            int n_emb = 0;
            if (n.finish != GEN_RUNNING && r->out->embedding) {
                /* written before the finish was published */
                emb = r->out->embedding;
                n_emb = r->out->n_embedding;
            }
            struct strbuf b = {0};
            if (engine_wire_put_event(&b, r->s.id, &n, emb, n_emb))
                send_frame(c, &b);
            strbuf_free(&b);
            last_generated = n.n_generated;
        }
        enum gen_finish finish = n.finish;
        int generated = n.n_generated;
        gen_news_free(&n);
        if (finish != GEN_RUNNING)
            break;
        if (news)
            maybe_fault(c, r, generated);
    }
    pthread_mutex_lock(&c->mu);
    for (struct child_request **l = &c->reqs; *l; l = &(*l)->next)
        if (*l == r) {
            *l = r->next;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    gen_output_release(r->out);
    engine_wire_submit_free(&r->s);
    free(r);
    thread_done(c);
    return NULL;
}

static bool start_thread(struct child *c, void *(*fn)(void *), void *arg)
{
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_mutex_lock(&c->mu);
    c->n_threads++;
    pthread_mutex_unlock(&c->mu);
    pthread_t t;
    bool ok = pthread_create(&t, &at, fn, arg) == 0;
    pthread_attr_destroy(&at);
    if (!ok)
        thread_done(c);
    return ok;
}

static void on_submit(struct child *c, const struct engine_wire_frame *f)
{
    struct err err = {0};
    struct child_request *r = calloc(1, sizeof *r);
    int rc;
    if (!r) {
        rc = err_set(&err, INFERD_ENOMEM, "out of memory in the engine child");
    } else if ((rc = engine_wire_get_submit(f, &r->s, &err)) == 0) {
        r->c = c;
        /* the grammar crosses as its source: compiled here, for this engine's tokenizer */
        struct gen_grammar *g = NULL;
        rc = 0;
        if (r->s.grammar.kind != STRUCTURED_NONE)
            rc = c->sm->grammars
                     ? grammar_cache_get(c->sm->grammars, &r->s.grammar, &g, &err)
                     : err_set(&err, INFERD_EUNSUPPORTED, "this engine runs without grammars");
        /* the adapter spec too: resolved against this process's registry, its references
         * held until the sequence has taken its own */
        if (rc == 0 && adapter_resolve(c->sm->adapters, r->s.adapter, &r->s.p, &err) < 0)
            rc = -INFERD_ENOENT;
        if (rc == 0) {
            r->s.p.grammar = g;
            rc = engine_submit(c->sm->engine, &r->s.p, &r->out, &err);
            r->s.p.grammar = NULL;
            adapter_put(&r->s.p);
        }
        gen_grammar_release(g); /* the sequence holds its own reference */
    }
    struct strbuf b = {0};
    if (engine_wire_put_submitted(&b, r ? r->s.id : 0, rc, rc < 0 ? err.msg : ""))
        send_frame(c, &b);
    strbuf_free(&b);
    if (rc < 0) {
        if (r)
            engine_wire_submit_free(&r->s);
        free(r);
        return;
    }
    pthread_mutex_lock(&c->mu);
    r->next = c->reqs;
    c->reqs = r;
    pthread_mutex_unlock(&c->mu);
    if (!start_thread(c, request_run, r)) {
        /* no thread to read it: cancel it and let go */
        atomic_store(&r->out->cancel, true);
        pthread_mutex_lock(&c->mu);
        c->reqs = r->next;
        pthread_mutex_unlock(&c->mu);
        gen_output_release(r->out);
        engine_wire_submit_free(&r->s);
        free(r);
    }
}

static void on_cancel(struct child *c, const struct engine_wire_frame *f)
{
    uint64_t id;
    struct err err = {0};
    if (engine_wire_get_cancel(f, &id, &err) < 0)
        return;
    pthread_mutex_lock(&c->mu);
    for (struct child_request *r = c->reqs; r; r = r->next)
        if (r->s.id == id)
            atomic_store(&r->out->cancel, true);
    pthread_mutex_unlock(&c->mu);
}

struct child_call {
    struct child *c;
    struct engine_wire_call call;
};

/* An adapter call on this process's registry (NULL: the backend runs none), its lists into
 * rep. */
static int adapter_call(struct adapter_registry *reg, const struct engine_wire_call *call,
                        struct engine_wire_reply *rep, struct err *err)
{
    if (!reg)
        return err_set(err, INFERD_EUNSUPPORTED, "this model's backend cannot run adapters");
    switch (call->kind) {
    case ENGINE_CALL_ADAPTERS:
    case ENGINE_CALL_ADAPTER_MOUNT: {
        bool mount = call->kind == ENGINE_CALL_ADAPTER_MOUNT;
        int cap = mount ? 1 : ENGINE_WIRE_MAX_ADAPTERS;
        if (!(rep->adapters = calloc((size_t)cap, sizeof *rep->adapters)))
            return err_set(err, INFERD_ENOMEM, "out of memory");
        int n = mount ? adapter_mount(reg, call->adapter_id, call->path, rep->adapters, err)
                      : adapter_list(reg, rep->adapters, cap);
        if (n < 0)
            return n;
        rep->n_adapters = mount ? 1 : n < cap ? n : cap;
        return 0;
    }
    case ENGINE_CALL_ADAPTERS_AVAILABLE: {
        if (!(rep->found = calloc(ENGINE_WIRE_MAX_ADAPTERS, sizeof *rep->found)))
            return err_set(err, INFERD_ENOMEM, "out of memory");
        int n = adapter_available(reg, rep->found, ENGINE_WIRE_MAX_ADAPTERS);
        rep->n_found = n < ENGINE_WIRE_MAX_ADAPTERS ? n : ENGINE_WIRE_MAX_ADAPTERS;
        return 0;
    }
    default: {
        int removed = 0;
        int rc = adapter_unmount(reg, call->adapter_id, &removed, err);
        rep->result = removed;
        return rc;
    }
    }
}

static void *call_run(void *arg)
{
    struct child_call *cc = arg;
    struct child *c = cc->c;
    struct engine *e = c->sm->engine;
    struct engine_wire_reply *rep = calloc(1, sizeof *rep);
    if (rep) {
        struct err err = {0};
        rep->call = cc->call.call;
        switch (cc->call.kind) {
        case ENGINE_CALL_FLUSH:
            rep->rc = engine_flush_cache(e, cc->call.timeout_ms, &rep->tier, &err);
            break;
        case ENGINE_CALL_CLOSE_SESSION: {
            int n = -1;
            rep->rc = engine_close_session(e, cc->call.session, &n, &err);
            rep->result = n;
            break;
        }
        case ENGINE_CALL_ADAPTERS:
        case ENGINE_CALL_ADAPTERS_AVAILABLE:
        case ENGINE_CALL_ADAPTER_MOUNT:
        case ENGINE_CALL_ADAPTER_UNMOUNT:
            rep->rc = adapter_call(c->sm->adapters, &cc->call, rep, &err);
            break;
        default:
            break;
        }
        if (rep->rc < 0)
            snprintf(rep->msg, sizeof rep->msg, "%s", err.msg);
        engine_get_stats(e, &rep->stats);
        if (cc->call.kind != ENGINE_CALL_FLUSH)
            rep->tier = rep->stats.ssd_cache;
        snprintf(rep->spec_kind, sizeof rep->spec_kind, "%s",
                 rep->stats.spec_kind ? rep->stats.spec_kind : "none");
        snprintf(rep->state, sizeof rep->state, "%s", rep->stats.state ? rep->stats.state : "");
        snprintf(rep->ssd_dir, sizeof rep->ssd_dir, "%s",
                 rep->stats.ssd_cache.store.dir ? rep->stats.ssd_cache.store.dir : "");
        struct strbuf b = {0};
        if (engine_wire_put_reply(&b, rep))
            send_frame(c, &b);
        strbuf_free(&b);
        engine_wire_reply_free(rep);
        free(rep);
    }
    free(cc);
    thread_done(c);
    return NULL;
}

static void on_call(struct child *c, const struct engine_wire_frame *f)
{
    struct child_call *cc = calloc(1, sizeof *cc);
    struct err err = {0};
    if (!cc)
        return;
    cc->c = c;
    if (engine_wire_get_call(f, &cc->call, &err) < 0 || !start_thread(c, call_run, cc)) {
        if (err.code)
            log_error("engine child: %s", err.msg);
        free(cc);
    }
}

static void send_progress(struct child *c)
{
    struct engine_stats st;
    engine_get_stats(c->sm->engine, &st);
    struct engine_wire_progress pr = {.steps = st.steps, .active = st.queued + st.running};
    struct strbuf b = {0};
    if (engine_wire_put_progress(&b, &pr))
        send_frame(c, &b);
    strbuf_free(&b);
}

int engine_child_serve(int fd, struct served_model *sm, const struct engine_wire_hello *hello,
                       int grace_ms, const struct engine_child_hooks *hooks, struct err *err)
{
    struct child c = {.fd = fd, .sm = sm, .hooks = hooks};
    pthread_mutex_init(&c.wmu, NULL);
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    struct strbuf b = {0};
    bool ok = engine_wire_put_hello(&b, hello);
    if (ok)
        send_frame(&c, &b);
    strbuf_free(&b);
    if (!ok)
        return err_set(err, INFERD_EIO, "cannot send the HELLO");
    struct strbuf in = {0};
    uint64_t last_progress = 0;
    for (;;) {
        if (now_ns() - last_progress >= PROGRESS_EVERY_NS) {
            send_progress(&c);
            last_progress = now_ns();
        }
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, POLL_MS) <= 0)
            continue;
        if (!strbuf_reserve(&in, READ_CHUNK))
            break;
        ssize_t n = read(fd, in.data + in.len, READ_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* the supervisor closed its side: stop */
        in.len += (size_t)n;
        size_t off = 0;
        bool bad = false;
        for (;;) {
            struct engine_wire_frame f;
            size_t used = 0;
            struct err ferr = {0};
            int k = engine_wire_parse((const uint8_t *)in.data + off, in.len - off, &f, &used,
                                      &ferr);
            if (k < 0) {
                log_error("engine child: %s", ferr.msg);
                bad = true;
            }
            if (k <= 0)
                break;
            off += used;
            if (f.type == ENGINE_WIRE_SUBMIT)
                on_submit(&c, &f);
            else if (f.type == ENGINE_WIRE_CANCEL)
                on_cancel(&c, &f);
            else if (f.type == ENGINE_WIRE_CALL)
                on_call(&c, &f);
            else {
                log_error("engine child: frame type %u is not the supervisor's to send", f.type);
                bad = true;
                break;
            }
        }
        strbuf_consume(&in, off);
        if (bad)
            break;
    }
    strbuf_free(&in);
    /* Running requests finish within the grace (their threads send the last events), the SSD
     * tier flushes, then every thread is waited for. */
    engine_shutdown(sm->engine, grace_ms);
    pthread_mutex_lock(&c.mu);
    while (c.n_threads > 0)
        pthread_cond_wait(&c.cv, &c.mu);
    pthread_mutex_unlock(&c.mu);
    pthread_mutex_destroy(&c.wmu);
    pthread_mutex_destroy(&c.mu);
    pthread_cond_destroy(&c.cv);
    return 0;
}
