/* api/metrics.c — request counters, and the /metrics (Prometheus) and /stats (JSON) views of
 * them together with the engine's own counters and latency histograms. */
#include "api/metrics.h"
#include "engine/transcribe.h"
#include "api/engine_proxy.h"
#include "api/structured.h"

#include <json-c/json.h>
#include <stdio.h>
#include <string.h>

#include "api/model_pool.h"
#include "api/reencode.h"
#include "api/response_store.h"
#include "api/server.h"
#include "base/timer.h"

static const int counted_statuses[] = METRICS_STATUSES;

int api_metrics_init(struct api_metrics *m, const char *const *labels, size_t n, struct err *err)
{
    if (n > API_METRICS_MAX_ROUTES)
        return err_set(err, INFERD_EINVAL, "%zu routes; the request counters hold at most %d", n,
                       API_METRICS_MAX_ROUTES);
    m->n_routes = n;
    for (size_t r = 0; r <= n; r++) {
        m->labels[r] = r < n ? labels[r] : "other";
        for (int s = 0; s < METRICS_N_STATUSES; s++)
            atomic_init(&m->requests[r][s], 0);
    }
    return 0;
}

void api_metrics_count(struct api_metrics *m, int slot, int status)
{
    if (slot < 0 || (size_t)slot > m->n_routes)
        slot = (int)m->n_routes;
    int s_slot = METRICS_N_STATUSES - 1;
    for (int s = 0; s < METRICS_N_STATUSES - 1; s++)
        if (counted_statuses[s] == status)
            s_slot = s;
    atomic_fetch_add_explicit(&m->requests[slot][s_slot], 1, memory_order_relaxed);
}

uint64_t api_metrics_total(const struct api_metrics *m)
{
    uint64_t n = 0;
    for (size_t r = 0; r <= m->n_routes; r++)
        for (int s = 0; s < METRICS_N_STATUSES; s++)
            n += atomic_load_explicit(&m->requests[r][s], memory_order_relaxed);
    return n;
}

/* A label's count of status slot s over every route that carries it; 0 for
 * every route but the first with that label, which reports them all. */
static uint64_t label_count(const struct api_metrics *m, size_t r, int s)
{
    for (size_t q = 0; q < r; q++)
        if (!strcmp(m->labels[q], m->labels[r]))
            return 0;
    uint64_t n = 0;
    for (size_t q = r; q <= m->n_routes; q++)
        if (!strcmp(m->labels[q], m->labels[r]))
            n += atomic_load_explicit(&m->requests[q][s], memory_order_relaxed);
    return n;
}

static void histogram_text(struct strbuf *out, const char *name, const char *help,
                           const struct histogram *h)
{
    strbuf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cumulative = 0;
    for (int b = 0; b <= h->n_bounds; b++) {
        cumulative += atomic_load_explicit(&h->counts[b], memory_order_relaxed);
        if (b < h->n_bounds)
            strbuf_printf(out, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[b],
                          (unsigned long long)cumulative);
        else
            strbuf_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n", name,
                          (unsigned long long)cumulative);
    }
    strbuf_printf(out, "%s_sum %.9f\n%s_count %llu\n", name,
                  (double)atomic_load_explicit(&h->sum_ns, memory_order_relaxed) * 1e-9, name,
                  (unsigned long long)cumulative);
}

/* The SSD tier's numbers, as /stats.ssd_cache has them: counters (since start) end in _total,
 * the rest are gauges (the store's contents, the queue, the cost model's rates and last
 * predictions, what the store found at start-up). */
static void ssd_cache_prometheus(const struct kv_tier_stats *t, struct strbuf *out)
{
    const struct ssd_stats *s = &t->store;
    struct {
        const char *name, *type, *help;
        double value;
    } rows[] = {
        {"blocks", "gauge", "KV blocks durable on disk.", (double)s->blocks},
        {"bytes", "gauge", "Bytes of the segment files on disk.", (double)s->bytes},
        {"max_bytes", "gauge", "The cap on disk (--ssd-cache-max; 0: none).", (double)s->max_bytes},
        {"writes_total", "counter", "Blocks made durable.", (double)s->writes},
        {"write_bytes_total", "counter", "KV bytes made durable.", (double)s->write_bytes},
        {"restores_total", "counter", "Blocks read back and verified.", (double)s->restores},
        {"restore_bytes_total", "counter", "KV bytes read back and verified.",
         (double)s->restore_bytes},
        {"restore_ms_last", "gauge", "Milliseconds the last batch of reads took.",
         s->restore_ms_last},
        {"pending", "gauge", "Blocks queued for writing, not yet durable.", (double)s->pending},
        {"pending_bytes", "gauge", "KV bytes queued for writing.", (double)s->pending_bytes},
        {"dropped_total", "counter", "Blocks given up without being written.", (double)s->dropped},
        {"failed_total", "counter", "Reads or writes that failed on I/O.", (double)s->failed},
        {"verify_failures_total", "counter",
         "Blocks read back that failed their chain or checksum check (dropped, recomputed).",
         (double)s->verify_failures},
        {"recomputes_total", "counter", "Blocks found on disk but computed after a failed read.",
         (double)t->recomputes},
        {"decisions_restore_total", "counter", "Cold prefixes the cost model read back.",
         (double)t->decisions_restore},
        {"decisions_recompute_total", "counter", "Cold prefixes the cost model computed instead.",
         (double)t->decisions_recompute},
        {"predicted_restore_ms", "gauge", "The last decision's predicted read time.",
         t->predicted_restore_ms},
        {"predicted_recompute_ms", "gauge", "The last decision's predicted prefill time.",
         t->predicted_recompute_ms},
        {"read_bytes_per_s", "gauge", "The store's read rate, measured at start-up.",
         t->read_bytes_per_s},
        {"prefill_tokens_per_s", "gauge", "The prefill rate, measured at start-up.",
         t->prefill_tokens_per_s},
        {"disabled", "gauge", "1 when the tier turned itself off (disk full or unwritable).",
         s->disabled ? 1.0 : 0.0},
        {"recovered_blocks", "gauge", "Blocks past the index's end verified and indexed at start-up.",
         (double)s->recovered_blocks},
        {"dropped_at_start", "gauge", "Index rows dropped at start-up (data missing or damaged).",
         (double)s->dropped_at_start},
        {"demoted_total", "counter", "Durable blocks that left memory after --ssd-demote-idle.",
         (double)t->demoted},
        {"evicted_blocks_total", "counter", "Blocks removed from disk to stay under the cap.",
         (double)s->evicted_blocks},
        {"cold_bytes_saved_total", "counter",
         "Bytes --ssd-kv-format's colder format kept off the disk (live block bytes less stored).",
         (double)t->cold_bytes_saved},
        {"direct_io", "gauge", "1 when the tier's files are written with O_DIRECT (--ssd-direct-io).",
         s->direct_io ? 1.0 : 0.0},
        {"write_calls_total", "counter", "Write system calls that appended block records.",
         (double)s->write_calls},
        {"in_place_writes_total", "counter",
         "Block records whose data was written straight from the KV pool or its host copy.",
         (double)s->in_place_writes},
        {"io_cpu_seconds_total", "counter", "CPU time the tier's I/O thread used.",
         (double)s->io_cpu_ns * 1e-9},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        strbuf_printf(out, "# HELP inferd_ssd_cache_%s %s\n# TYPE inferd_ssd_cache_%s %s\n"
                           "inferd_ssd_cache_%s %.17g\n",
                      rows[i].name, rows[i].help, rows[i].name, rows[i].type, rows[i].name,
                      rows[i].value);
}

/* /stats.host_tier: the host-RAM tier under a device pool, or null without one. */
static json_object *host_tier_json(const struct kv_tier_stats *t)
{
    if (t->host_max_bytes == 0)
        return NULL;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "blocks", json_object_new_int64((int64_t)t->host_blocks));
    json_object_object_add(o, "bytes", json_object_new_int64((int64_t)t->host_bytes));
    json_object_object_add(o, "max_bytes", json_object_new_int64((int64_t)t->host_max_bytes));
    json_object_object_add(o, "hits", json_object_new_int64((int64_t)t->host_hits));
    json_object_object_add(o, "stores", json_object_new_int64((int64_t)t->host_stores));
    json_object_object_add(o, "evictions", json_object_new_int64((int64_t)t->host_evictions));
    return o;
}

/* /stats.checkpoints: generation checkpoints, or null when they are off. */
static json_object *checkpoints_json(const struct engine_stats *st)
{
    if (!st->checkpoints)
        return NULL;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "saved", json_object_new_int64((int64_t)st->checkpoints_saved));
    json_object_object_add(o, "resumed", json_object_new_int64((int64_t)st->checkpoints_resumed));
    json_object_object_add(o, "removed", json_object_new_int64((int64_t)st->checkpoints_removed));
    json_object_object_add(o, "failed", json_object_new_int64((int64_t)st->checkpoints_failed));
    return o;
}

/* /stats.ssd_cache: the tier's numbers, or null without a tier. */
static json_object *ssd_cache_json(const struct kv_tier_stats *t)
{
    if (!t->enabled)
        return NULL;
    const struct ssd_stats *s = &t->store;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "dir", s->dir ? json_object_new_string(s->dir) : NULL);
    struct {
        const char *name;
        uint64_t value;
    } counts[] = {
        {"blocks", s->blocks},
        {"bytes", s->bytes},
        {"max_bytes", s->max_bytes},
        {"cap_bytes", s->cap_bytes},
        {"writes", s->writes},
        {"write_bytes", s->write_bytes},
        {"restores", s->restores},
        {"restore_bytes", s->restore_bytes},
        {"pending", s->pending},
        {"pending_bytes", s->pending_bytes},
        {"unqueued", t->unsaved},
        {"loading", t->loading},
        {"dropped", s->dropped},
        {"failed", s->failed},
        {"verify_failures", s->verify_failures},
        {"recomputes", t->recomputes},
        {"decisions_restore", t->decisions_restore},
        {"decisions_recompute", t->decisions_recompute},
        {"recovered_blocks", s->recovered_blocks},
        {"dropped_at_start", s->dropped_at_start},
        {"torn_tails", s->torn_tails},
        {"evicted_blocks", s->evicted_blocks},
        {"demoted", t->demoted},
        {"cold_blocks", t->cold_blocks},
        {"cold_bytes_saved", t->cold_bytes_saved},
        {"write_calls", s->write_calls},
        {"in_place_writes", s->in_place_writes},
    };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        json_object_object_add(o, counts[i].name, json_object_new_int64((int64_t)counts[i].value));
    /* --ssd-kv-format: the disk's format (null: the live one) */
    json_object_object_add(o, "kv_format",
                           t->cold_format[0] ? json_object_new_string(t->cold_format) : NULL);
    struct {
        const char *name;
        double value;
    } rates[] = {
        {"restore_ms_last", s->restore_ms_last},
        {"predicted_restore_ms", t->predicted_restore_ms},
        {"predicted_recompute_ms", t->predicted_recompute_ms},
        {"read_bytes_per_s", t->read_bytes_per_s},
        {"prefill_tokens_per_s", t->prefill_tokens_per_s},
    };
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++)
        json_object_object_add(o, rates[i].name, json_object_new_double(rates[i].value));
    json_object_object_add(o, "io_cpu_ms", json_object_new_double((double)s->io_cpu_ns * 1e-6));
    json_object_object_add(o, "direct_io", json_object_new_boolean(s->direct_io));
    json_object_object_add(o, "index_rebuilt", json_object_new_boolean(s->index_rebuilt));
    json_object_object_add(o, "disabled", json_object_new_boolean(s->disabled));
    json_object_object_add(o, "disable_reason",
                           s->disabled ? json_object_new_string(s->disable_reason) : NULL);
    return o;
}


/* The pool's entries for /stats: state, size, loads and their times, residency. */
static json_object *pool_json(struct model_pool *p)
{
    struct model_pool_totals t;
    model_pool_totals(p, &t);
    json_object *o = json_object_new_object();
    json_object_object_add(o, "default", json_object_new_string(model_pool_default_id(p)));
    json_object_object_add(o, "memory_limit_bytes",
                           t.memory_limit_bytes ? json_object_new_int64((int64_t)t.memory_limit_bytes)
                                                : NULL);
    json_object_object_add(o, "resident_bytes", json_object_new_int64((int64_t)t.resident_bytes));
    json_object_object_add(o, "other_bytes", json_object_new_int64((int64_t)t.extra_bytes));
    json_object_object_add(o, "resident", json_object_new_int(t.resident));
    json_object_object_add(o, "loads", json_object_new_int64((int64_t)t.loads));
    json_object_object_add(o, "unloads", json_object_new_int64((int64_t)t.unloads));
    json_object_object_add(o, "evictions", json_object_new_int64((int64_t)t.evictions));
    json_object_object_add(o, "waits", json_object_new_int64((int64_t)t.waits));
    json_object_object_add(o, "waiting", json_object_new_int(t.waiting));
    json_object_object_add(o, "refused", json_object_new_int64((int64_t)t.refused));
    json_object *models = json_object_new_array();
    for (int i = 0; i < t.entries; i++) {
        struct model_pool_info in;
        model_pool_info(p, i, &in);
        json_object *m = json_object_new_object();
        json_object_object_add(m, "id", json_object_new_string(in.id));
        json_object_object_add(m, "state", json_object_new_string(model_pool_state_name(in.state)));
        json_object_object_add(m, "default", json_object_new_boolean(in.is_default));
        json_object_object_add(m, "bytes", json_object_new_int64((int64_t)in.bytes));
        json_object_object_add(m, "in_flight", json_object_new_int(in.in_flight));
        json_object_object_add(m, "waiting", json_object_new_int(in.waiting));
        json_object_object_add(m, "requests", json_object_new_int64((int64_t)in.requests));
        json_object_object_add(m, "loads", json_object_new_int64((int64_t)in.loads));
        json_object_object_add(m, "unloads", json_object_new_int64((int64_t)in.unloads));
        json_object_object_add(m, "load_failures", json_object_new_int64((int64_t)in.load_failures));
        json_object_object_add(m, "demotions", json_object_new_int64((int64_t)in.demotions));
        json_object_object_add(m, "load_s_last", json_object_new_double(in.load_s_last));
        json_object_object_add(m, "load_s_total", json_object_new_double(in.load_s_total));
        json_object_object_add(m, "resident_s", json_object_new_double(in.resident_s));
        json_object_object_add(m, "idle_s", json_object_new_double(in.idle_s));
        json_object_object_add(m, "last_error",
                               in.last_error[0] ? json_object_new_string(in.last_error) : NULL);
        json_object_array_add(models, m);
    }
    json_object_object_add(o, "models", models);
    return o;
}

/* The pool's entries for /metrics, one series per model. */
static void pool_prometheus(struct model_pool *p, struct strbuf *out)
{
    struct model_pool_totals t;
    model_pool_totals(p, &t);
    strbuf_printf(out,
                  "# HELP inferd_pool_resident_bytes Bytes of the pool's resident models.\n"
                  "# TYPE inferd_pool_resident_bytes gauge\n"
                  "inferd_pool_resident_bytes %llu\n"
                  "# HELP inferd_pool_evictions_total Models unloaded to make room for another.\n"
                  "# TYPE inferd_pool_evictions_total counter\n"
                  "inferd_pool_evictions_total %llu\n"
                  "# HELP inferd_pool_waiting Requests waiting for a model to load.\n"
                  "# TYPE inferd_pool_waiting gauge\n"
                  "inferd_pool_waiting %d\n",
                  (unsigned long long)t.resident_bytes, (unsigned long long)t.evictions,
                  t.waiting);
    static const char *const series[][2] = {
        {"inferd_pool_model_resident", "gauge 1 while the model is resident (or unloading)."},
        {"inferd_pool_model_loading", "gauge 1 while the model loads."},
        {"inferd_pool_model_bytes", "gauge Bytes the model holds resident (estimated before its first load)."},
        {"inferd_pool_model_loads_total", "counter Loads of the model."},
        {"inferd_pool_model_unloads_total", "counter Unloads of the model."},
        {"inferd_pool_model_load_seconds_last", "gauge Seconds its last load took."},
        {"inferd_pool_model_resident_seconds_total", "counter Seconds it has been resident."},
    };
    for (size_t k = 0; k < sizeof series / sizeof series[0]; k++) {
        const char *help = strchr(series[k][1], ' ');
        strbuf_printf(out, "# HELP %s%s\n# TYPE %s %.*s\n", series[k][0], help, series[k][0],
                      (int)(help - series[k][1]), series[k][1]);
        for (int i = 0; i < t.entries; i++) {
            struct model_pool_info in;
            model_pool_info(p, i, &in);
            double v = 0;
            switch (k) {
            case 0: v = in.state == MODEL_POOL_RESIDENT || in.state == MODEL_POOL_UNLOADING; break;
            case 1: v = in.state == MODEL_POOL_LOADING; break;
            case 2: v = (double)in.bytes; break;
            case 3: v = (double)in.loads; break;
            case 4: v = (double)in.unloads; break;
            case 5: v = in.load_s_last; break;
            default: v = in.resident_s; break;
            }
            strbuf_printf(out, "%s{model=\"%s\"} %.17g\n", series[k][0], in.id, v);
        }
    }
}

static void prometheus_model(const struct server *srv, const struct served_model *sm,
                             struct strbuf *out)
{
    if (srv->transcriber) {
        struct transcriber_stats ts;
        transcriber_stats(srv->transcriber, &ts);
        strbuf_printf(out,
                      "# HELP inferd_transcription_requests_total Transcriptions and translations run.\n"
                      "# TYPE inferd_transcription_requests_total counter\n"
                      "inferd_transcription_requests_total %llu\n"
                      "# HELP inferd_transcription_audio_seconds_total Seconds of audio transcribed.\n"
                      "# TYPE inferd_transcription_audio_seconds_total counter\n"
                      "inferd_transcription_audio_seconds_total %.3f\n"
                      "# HELP inferd_transcription_compute_seconds_total Seconds spent transcribing.\n"
                      "# TYPE inferd_transcription_compute_seconds_total counter\n"
                      "inferd_transcription_compute_seconds_total %.3f\n",
                      (unsigned long long)ts.requests, ts.audio_seconds, ts.compute_seconds);
    }
    strbuf_puts(out, "# HELP inferd_requests_total HTTP requests answered, by route and status.\n"
                     "# TYPE inferd_requests_total counter\n");
    const struct api_metrics *m = &srv->metrics;
    if (srv->pool)
        pool_prometheus(srv->pool, out);
    for (size_t r = 0; r <= m->n_routes; r++)
        for (int s = 0; s < METRICS_N_STATUSES; s++) {
            uint64_t n = label_count(m, r, s);
            if (n == 0)
                continue;
            if (s < METRICS_N_STATUSES - 1)
                strbuf_printf(out, "inferd_requests_total{route=\"%s\",status=\"%d\"} %llu\n",
                              m->labels[r], counted_statuses[s], (unsigned long long)n);
            else
                strbuf_printf(out, "inferd_requests_total{route=\"%s\",status=\"other\"} %llu\n",
                              m->labels[r], (unsigned long long)n);
        }
    if (!served_engine_ready(sm))
        return;
    struct engine_stats st;
    served_engine_stats(sm, &st);
    strbuf_printf(out,
                  "# HELP inferd_prompt_tokens_total Prompt tokens of admitted requests.\n"
                  "# TYPE inferd_prompt_tokens_total counter\n"
                  "inferd_prompt_tokens_total %llu\n"
                  "# HELP inferd_generated_tokens_total Tokens generated.\n"
                  "# TYPE inferd_generated_tokens_total counter\n"
                  "inferd_generated_tokens_total %llu\n"
                  "# HELP inferd_requests_cancelled_total Generations cancelled (client gone or "
                  "shutdown).\n"
                  "# TYPE inferd_requests_cancelled_total counter\n"
                  "inferd_requests_cancelled_total %llu\n"
                  "# HELP inferd_requests_refused_total Requests refused because the queue was "
                  "full.\n"
                  "# TYPE inferd_requests_refused_total counter\n"
                  "inferd_requests_refused_total %llu\n"
                  "# HELP inferd_queue_depth Requests waiting for admission.\n"
                  "# TYPE inferd_queue_depth gauge\n"
                  "inferd_queue_depth %d\n"
                  "# HELP inferd_running_sequences Sequences being generated.\n"
                  "# TYPE inferd_running_sequences gauge\n"
                  "inferd_running_sequences %d\n"
                  "# HELP inferd_kv_blocks_free KV cache blocks free.\n"
                  "# TYPE inferd_kv_blocks_free gauge\n"
                  "inferd_kv_blocks_free %d\n",
                  (unsigned long long)st.prompt_tokens, (unsigned long long)st.generated_tokens,
                  (unsigned long long)st.requests_cancelled,
                  (unsigned long long)st.requests_refused, st.queued, st.running,
                  st.kv_blocks_free);
    const struct engine_config *cfg = served_engine_config(sm);
    const struct kv_prefix_stats *pc = &st.prompt_cache;
    strbuf_printf(out,
                  "# HELP inferd_server_started_at_seconds When the server started (Unix time).\n"
                  "# TYPE inferd_server_started_at_seconds gauge\n"
                  "inferd_server_started_at_seconds %lld\n",
                  (long long)srv->created);
    struct {
        const char *name, *type, *help;
        unsigned long long value;
    } rows[] = {
        {"inferd_prompt_cache_blocks", "gauge", "KV blocks in the prefix cache.", pc->blocks},
        {"inferd_prompt_cache_bytes", "gauge", "KV bytes in the prefix cache.", pc->bytes},
        {"inferd_prompt_cache_max_bytes", "gauge",
         "Cap on the prefix cache's unreferenced KV bytes (--prompt-cache).", pc->max_bytes},
        {"inferd_prompt_cache_hits_total", "counter", "Prompts that reused cached KV.", pc->hits},
        {"inferd_prompt_cache_misses_total", "counter", "Prompts that reused no cached KV.",
         pc->misses},
        {"inferd_prompt_cache_hit_tokens_total", "counter", "Prompt tokens whose KV was reused.",
         pc->hit_tokens},
        {"inferd_prompt_cache_evictions_total", "counter", "Cached KV blocks evicted.",
         pc->evictions},
        {"inferd_prompt_cache_session_hits_total", "counter",
         "Prompts of a session that reused cached KV.", pc->session_hits},
        {"inferd_prompt_cache_session_misses_total", "counter",
         "Prompts of a session that reused no cached KV.", pc->session_misses},
        {"inferd_prompt_cache_sessions", "gauge", "Open sessions.", pc->sessions},
        {"inferd_batch_configured", "gauge", "Sequences one step may hold (--max-batch).",
         (unsigned long long)cfg->max_seqs},
        {"inferd_batch_running", "gauge", "Sequences being generated.",
         (unsigned long long)st.running},
        {"inferd_batch_waiting", "gauge", "Sequences waiting for admission.",
         (unsigned long long)st.waiting},
        {"inferd_kv_bytes", "gauge", "KV bytes held by running sequences.", st.kv_bytes},
        {"inferd_kv_budget_bytes", "gauge", "Admission budget on KV bytes (0: none).",
         st.kv_budget_bytes},
        {"inferd_admission_enforced_context_tokens", "gauge",
         "Positions a request may use (prompt + generated).", (unsigned long long)cfg->n_ctx},
        {"inferd_admission_rejected_total", "counter", "Requests refused at admission.",
         st.requests_rejected},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        strbuf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", rows[i].name, rows[i].help,
                      rows[i].name, rows[i].type, rows[i].name, rows[i].value);
    if (strcmp(st.spec_kind, "none") != 0) {
        double rate = st.spec_drafted ? (double)st.spec_accepted / (double)st.spec_drafted : 0;
        double mean = st.spec_verify_steps
                          ? (double)st.spec_accepted / (double)st.spec_verify_steps
                          : 0;
        strbuf_printf(out,
                      "# HELP inferd_spec_drafted_total Draft tokens verified (speculative decoding).\n"
                      "# TYPE inferd_spec_drafted_total counter\ninferd_spec_drafted_total %llu\n"
                      "# HELP inferd_spec_accepted_total Draft tokens the target kept.\n"
                      "# TYPE inferd_spec_accepted_total counter\ninferd_spec_accepted_total %llu\n"
                      "# HELP inferd_spec_verify_steps_total Verify entries (a sequence's drafts in one target step).\n"
                      "# TYPE inferd_spec_verify_steps_total counter\n"
                      "inferd_spec_verify_steps_total %llu\n"
                      "# HELP inferd_spec_draft_steps_total Draft model forward steps.\n"
                      "# TYPE inferd_spec_draft_steps_total counter\n"
                      "inferd_spec_draft_steps_total %llu\n"
                      "# HELP inferd_spec_acceptance_rate Kept drafts over verified drafts.\n"
                      "# TYPE inferd_spec_acceptance_rate gauge\ninferd_spec_acceptance_rate %.6f\n"
                      "# HELP inferd_spec_mean_accepted_length Kept drafts per verify entry.\n"
                      "# TYPE inferd_spec_mean_accepted_length gauge\n"
                      "inferd_spec_mean_accepted_length %.6f\n",
                      (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_accepted,
                      (unsigned long long)st.spec_verify_steps,
                      (unsigned long long)st.spec_draft_steps, rate, mean);
    }
    strbuf_printf(out,
                  "# HELP inferd_kv_bytes_per_token KV cache bytes per token over every layer, by "
                  "format (--kv-quant).\n"
                  "# TYPE inferd_kv_bytes_per_token gauge\n"
                  "inferd_kv_bytes_per_token{kv_quant=\"%s\"} %llu\n",
                  st.kv_quant, (unsigned long long)st.kv_bytes_per_token);
    for (int l = 0; l < st.kv_quant_layers; l++) {
        if (l == 0)
            strbuf_printf(out, "# HELP inferd_kv_quant_layer Each layer's KV format under a "
                               "per-layer config (value 1).\n"
                               "# TYPE inferd_kv_quant_layer gauge\n");
        strbuf_printf(out, "inferd_kv_quant_layer{layer=\"%d\",kv_quant=\"%s\"} 1\n", l,
                      st.kv_quant_layer[l]);
    }
    if (st.ssd_cache.enabled)
        ssd_cache_prometheus(&st.ssd_cache, out);
    if (st.ssd_cache.host_max_bytes > 0) {
        const struct kv_tier_stats *t = &st.ssd_cache;
        strbuf_printf(out,
                      "# HELP inferd_host_tier_blocks KV blocks in the host-RAM tier.\n"
                      "# TYPE inferd_host_tier_blocks gauge\ninferd_host_tier_blocks %llu\n"
                      "# HELP inferd_host_tier_bytes KV bytes in the host-RAM tier.\n"
                      "# TYPE inferd_host_tier_bytes gauge\ninferd_host_tier_bytes %llu\n"
                      "# HELP inferd_host_tier_hits_total Blocks copied back from host memory.\n"
                      "# TYPE inferd_host_tier_hits_total counter\ninferd_host_tier_hits_total %llu\n"
                      "# HELP inferd_host_tier_evictions_total Blocks dropped from host memory.\n"
                      "# TYPE inferd_host_tier_evictions_total counter\n"
                      "inferd_host_tier_evictions_total %llu\n",
                      (unsigned long long)t->host_blocks, (unsigned long long)t->host_bytes,
                      (unsigned long long)t->host_hits, (unsigned long long)t->host_evictions);
    }
    if (st.checkpoints)
        strbuf_printf(out,
                      "# HELP inferd_checkpoints_saved_total Generation checkpoints written.\n"
                      "# TYPE inferd_checkpoints_saved_total counter\n"
                      "inferd_checkpoints_saved_total %llu\n"
                      "# HELP inferd_checkpoints_resumed_total Generations resumed from one.\n"
                      "# TYPE inferd_checkpoints_resumed_total counter\n"
                      "inferd_checkpoints_resumed_total %llu\n",
                      (unsigned long long)st.checkpoints_saved,
                      (unsigned long long)st.checkpoints_resumed);
    if (sm->reencode) {
        struct reencode_stats rs;
        reencode_get_stats(sm->reencode, &rs);
        strbuf_printf(out,
                      "# HELP inferd_reencode_entries Conversations whose generated ids are kept.\n"
                      "# TYPE inferd_reencode_entries gauge\n"
                      "inferd_reencode_entries %zu\n"
                      "# HELP inferd_reencode_bytes Bytes of text and ids kept for re-encoding.\n"
                      "# TYPE inferd_reencode_bytes gauge\n"
                      "inferd_reencode_bytes %zu\n"
                      "# HELP inferd_reencode_hits_total Prompts that reused generated ids.\n"
                      "# TYPE inferd_reencode_hits_total counter\n"
                      "inferd_reencode_hits_total %llu\n"
                      "# HELP inferd_reencode_misses_total Prompts encoded without reused ids.\n"
                      "# TYPE inferd_reencode_misses_total counter\n"
                      "inferd_reencode_misses_total %llu\n"
                      "# HELP inferd_reencode_evictions_total Entries dropped for space.\n"
                      "# TYPE inferd_reencode_evictions_total counter\n"
                      "inferd_reencode_evictions_total %llu\n",
                      rs.entries, rs.bytes, (unsigned long long)rs.hits,
                      (unsigned long long)rs.misses, (unsigned long long)rs.evictions);
    }
    if (srv->responses) {
        struct response_store_stats rs;
        response_store_get_stats(srv->responses, &rs);
        strbuf_printf(out,
                      "# HELP inferd_response_store_entries Responses kept for "
                      "previous_response_id and GET /v1/responses/{id}.\n"
                      "# TYPE inferd_response_store_entries gauge\n"
                      "inferd_response_store_entries %zu\n"
                      "# HELP inferd_response_store_bytes Bytes of the stored responses.\n"
                      "# TYPE inferd_response_store_bytes gauge\n"
                      "inferd_response_store_bytes %zu\n"
                      "# HELP inferd_response_store_max_bytes The store's cap "
                      "(--response-store-mb).\n"
                      "# TYPE inferd_response_store_max_bytes gauge\n"
                      "inferd_response_store_max_bytes %zu\n"
                      "# HELP inferd_response_store_ttl_seconds How long a stored response is "
                      "kept (--response-store-ttl-s).\n"
                      "# TYPE inferd_response_store_ttl_seconds gauge\n"
                      "inferd_response_store_ttl_seconds %llu\n"
                      "# HELP inferd_response_store_evictions_total Stored responses dropped for "
                      "space.\n"
                      "# TYPE inferd_response_store_evictions_total counter\n"
                      "inferd_response_store_evictions_total %llu\n"
                      "# HELP inferd_response_store_expirations_total Stored responses dropped "
                      "for age.\n"
                      "# TYPE inferd_response_store_expirations_total counter\n"
                      "inferd_response_store_expirations_total %llu\n",
                      rs.entries, rs.bytes, rs.max_bytes, (unsigned long long)rs.ttl_s,
                      (unsigned long long)rs.evictions, (unsigned long long)rs.expirations);
    }
    const struct engine_metrics *em = served_engine_metrics(sm);
    histogram_text(out, "inferd_time_to_first_token_seconds",
                   "Seconds from a request's arrival to its first generated token.", &em->ttft);
    histogram_text(out, "inferd_inter_token_latency_seconds",
                   "Seconds between consecutive tokens of one sequence.", &em->inter_token);
    histogram_text(out, "inferd_request_queue_time_seconds",
                   "Seconds from a request's arrival to its admission into the running batch.",
                   &em->queue_time);
    histogram_text(out, "inferd_request_prefill_time_seconds",
                   "Seconds from a request's admission to its first generated token.",
                   &em->prefill_time);
}

void api_metrics_prometheus(const struct server *srv, struct strbuf *out)
{
    struct served_model *held = served_model_peek(srv), none = {0};
    prometheus_model(srv, held ? held : &none, out);
    served_model_release(srv, held);
}

void api_metrics_stats_json(const struct server *srv, struct strbuf *out)
{
    /* The engine's sections are the default model's, while it is resident. */
    struct served_model *held = served_model_peek(srv), none = {0};
    const struct served_model *sm = held ? held : &none;
    if (!held)
        snprintf(none.id, sizeof none.id, "%s", srv->served.id);
    json_object *root = json_object_new_object();
    json_object_object_add(root, "model", json_object_new_string(sm->id));
    json_object_object_add(root, "uptime_s",
                           json_object_new_double((double)(now_ns() - srv->started_ns) * 1e-9));
    json_object_object_add(root, "ready", json_object_new_boolean(atomic_load(&srv->ready)));
    json_object *http = json_object_new_object();
    json_object_object_add(http, "requests",
                           json_object_new_int64((int64_t)api_metrics_total(&srv->metrics)));
    json_object_object_add(root, "http", http);
    if (srv->transcriber) {
        struct transcriber_stats ts;
        transcriber_stats(srv->transcriber, &ts);
        json_object *a = json_object_new_object();
        json_object_object_add(a, "model", json_object_new_string(transcriber_id(srv->transcriber)));
        json_object_object_add(a, "loaded", json_object_new_boolean(ts.loaded));
        json_object_object_add(a, "requests", json_object_new_int64((int64_t)ts.requests));
        json_object_object_add(a, "failures", json_object_new_int64((int64_t)ts.failures));
        json_object_object_add(a, "audio_seconds", json_object_new_double(ts.audio_seconds));
        json_object_object_add(a, "compute_seconds", json_object_new_double(ts.compute_seconds));
        json_object_object_add(a, "mel_seconds", json_object_new_double(ts.mel_seconds));
        json_object_object_add(a, "encode_seconds", json_object_new_double(ts.encode_seconds));
        json_object_object_add(a, "decode_seconds", json_object_new_double(ts.decode_seconds));
        json_object_object_add(a, "windows", json_object_new_int64((int64_t)ts.windows));
        json_object_object_add(a, "decoder_steps", json_object_new_int64((int64_t)ts.decoder_steps));
        json_object_object_add(a, "passes", json_object_new_int64((int64_t)ts.passes));
        json_object_object_add(a, "real_time_factor",
                               ts.audio_seconds > 0
                                   ? json_object_new_double(ts.compute_seconds / ts.audio_seconds)
                                   : NULL);
        json_object_object_add(root, "transcription", a);
    }
    if (served_engine_ready(sm)) {
        struct engine_stats st;
        served_engine_stats(sm, &st);
        const struct engine_config *cfg = served_engine_config(sm);
        json_object *e = json_object_new_object();
        json_object_object_add(e, "state", json_object_new_string(st.state));
        json_object_object_add(e, "queue_depth", json_object_new_int(st.queued));
        json_object_object_add(e, "running", json_object_new_int(st.running));
        json_object_object_add(e, "requests_admitted",
                               json_object_new_int64((int64_t)st.requests_admitted));
        json_object_object_add(e, "requests_finished",
                               json_object_new_int64((int64_t)st.requests_finished));
        json_object_object_add(e, "requests_cancelled",
                               json_object_new_int64((int64_t)st.requests_cancelled));
        json_object_object_add(e, "requests_refused",
                               json_object_new_int64((int64_t)st.requests_refused));
        json_object_object_add(e, "prompt_tokens", json_object_new_int64((int64_t)st.prompt_tokens));
        json_object_object_add(e, "generated_tokens",
                               json_object_new_int64((int64_t)st.generated_tokens));
        json_object_object_add(e, "steps", json_object_new_int64((int64_t)st.steps));
        json_object_object_add(e, "preemptions", json_object_new_int64((int64_t)st.preemptions));
        json_object_object_add(e, "context", json_object_new_int(cfg->n_ctx));
        json_object_object_add(e, "max_sequences", json_object_new_int(cfg->max_seqs));
        json_object_object_add(e, "max_queue", json_object_new_int(cfg->max_queue));
        json_object_object_add(e, "kv_blocks_total", json_object_new_int(st.kv_blocks_total));
        json_object_object_add(e, "kv_blocks_free", json_object_new_int(st.kv_blocks_free));
        json_object_object_add(root, "engine", e);

        /* Structured output: masks, jump-forward and the compiled-grammar cache. */
        json_object *so = json_object_new_object();
        json_object_object_add(so, "masks", json_object_new_int64((int64_t)st.grammar_masks));
        json_object_object_add(so, "mask_us_p50", json_object_new_double(st.grammar_mask_us_p50));
        json_object_object_add(so, "mask_us_p99", json_object_new_double(st.grammar_mask_us_p99));
        json_object_object_add(so, "forced_tokens",
                               json_object_new_int64((int64_t)st.grammar_forced_tokens));
        if (sm->grammars) {
            struct grammar_cache_stats gs;
            grammar_cache_stats(sm->grammars, &gs);
            json_object_object_add(so, "cache_entries", json_object_new_int(gs.entries));
            json_object_object_add(so, "cache_capacity", json_object_new_int(gs.capacity));
            json_object_object_add(so, "cache_hits", json_object_new_int64((int64_t)gs.hits));
            json_object_object_add(so, "cache_misses", json_object_new_int64((int64_t)gs.misses));
        }
        json_object_object_add(root, "structured_output", so);

        /* Speculative decoding: what verification kept. */
        json_object *sp = json_object_new_object();
        json_object_object_add(sp, "kind", json_object_new_string(st.spec_kind));
        json_object_object_add(sp, "num_draft_tokens", json_object_new_int(st.spec_max_drafts));
        if (st.spec_draft_vocab > 0) {
            json_object_object_add(sp, "draft_vocab", json_object_new_int(st.spec_draft_vocab));
            json_object_object_add(sp, "draft_vocab_auto",
                                   json_object_new_boolean(st.spec_draft_vocab_auto));
        }
        json_object_object_add(sp, "drafted", json_object_new_int64((int64_t)st.spec_drafted));
        json_object_object_add(sp, "accepted", json_object_new_int64((int64_t)st.spec_accepted));
        json_object_object_add(sp, "verify_steps",
                               json_object_new_int64((int64_t)st.spec_verify_steps));
        json_object_object_add(sp, "draft_steps",
                               json_object_new_int64((int64_t)st.spec_draft_steps));
        json_object_object_add(
            sp, "acceptance_rate",
            json_object_new_double(st.spec_drafted ? (double)st.spec_accepted /
                                                         (double)st.spec_drafted
                                                   : 0));
        json_object_object_add(
            sp, "mean_accepted_length",
            json_object_new_double(st.spec_verify_steps ? (double)st.spec_accepted /
                                                              (double)st.spec_verify_steps
                                                        : 0));
        json_object_object_add(root, "speculative", sp);

        const struct kv_prefix_stats *pc = &st.prompt_cache;
        json_object *cache = json_object_new_object();
        json_object_object_add(cache, "blocks", json_object_new_int64((int64_t)pc->blocks));
        json_object_object_add(cache, "bytes", json_object_new_int64((int64_t)pc->bytes));
        json_object_object_add(cache, "max_bytes", json_object_new_int64((int64_t)pc->max_bytes));
        json_object_object_add(cache, "hits", json_object_new_int64((int64_t)pc->hits));
        json_object_object_add(cache, "misses", json_object_new_int64((int64_t)pc->misses));
        json_object_object_add(cache, "hit_tokens", json_object_new_int64((int64_t)pc->hit_tokens));
        json_object_object_add(cache, "evictions", json_object_new_int64((int64_t)pc->evictions));
        json_object_object_add(cache, "session_hits",
                               json_object_new_int64((int64_t)pc->session_hits));
        json_object_object_add(cache, "session_misses",
                               json_object_new_int64((int64_t)pc->session_misses));
        json_object_object_add(cache, "sessions", json_object_new_int64((int64_t)pc->sessions));
        json_object_object_add(root, "prompt_cache", cache);

        json_object *batch = json_object_new_object();
        json_object_object_add(batch, "configured", json_object_new_int(cfg->max_seqs));
        json_object_object_add(batch, "running", json_object_new_int(st.running));
        json_object_object_add(batch, "waiting", json_object_new_int(st.waiting));
        json_object_object_add(batch, "kv_bytes", json_object_new_int64((int64_t)st.kv_bytes));
        json_object_object_add(batch, "kv_budget_bytes",
                               json_object_new_int64((int64_t)st.kv_budget_bytes));
        json_object_object_add(root, "batch", batch);

        /* The KV cache's format, named by its cache key (kv_format_name). */
        json_object *kq = json_object_new_object();
        json_object_object_add(kq, "mode", json_object_new_string(st.kv_quant));
        json_object_object_add(kq, "bytes_per_token",
                               json_object_new_int64((int64_t)st.kv_bytes_per_token));
        if (st.kv_quant_layers > 0) {
            json_object *layers = json_object_new_array();
            for (int l = 0; l < st.kv_quant_layers; l++)
                json_object_array_add(layers, json_object_new_string(st.kv_quant_layer[l]));
            json_object_object_add(kq, "layers", layers);
        }
        json_object_object_add(root, "kv_quant", kq);

        json_object *adm = json_object_new_object();
        json_object_object_add(adm, "enforced_context_tokens", json_object_new_int(cfg->n_ctx));
        json_object_object_add(adm, "rejected",
                               json_object_new_int64((int64_t)st.requests_rejected));
        json_object_object_add(root, "admission", adm);
        json_object_object_add(root, "ssd_cache", ssd_cache_json(&st.ssd_cache));
        json_object_object_add(root, "host_tier", host_tier_json(&st.ssd_cache));
        json_object_object_add(root, "checkpoints", checkpoints_json(&st));
    }
    json_object *server = json_object_new_object();
    json_object_object_add(server, "started_at", json_object_new_int64((int64_t)srv->created));
    json_object_object_add(root, "server", server);
    if (sm->reencode) {
        struct reencode_stats rs;
        reencode_get_stats(sm->reencode, &rs);
        json_object *re = json_object_new_object();
        json_object_object_add(re, "entries", json_object_new_int64((int64_t)rs.entries));
        json_object_object_add(re, "bytes", json_object_new_int64((int64_t)rs.bytes));
        json_object_object_add(re, "max_bytes", json_object_new_int64((int64_t)rs.max_bytes));
        json_object_object_add(re, "hits", json_object_new_int64((int64_t)rs.hits));
        json_object_object_add(re, "misses", json_object_new_int64((int64_t)rs.misses));
        json_object_object_add(re, "evictions", json_object_new_int64((int64_t)rs.evictions));
        json_object_object_add(root, "reencode", re);
    }
    if (srv->responses) {
        struct response_store_stats rs;
        response_store_get_stats(srv->responses, &rs);
        json_object *st = json_object_new_object();
        json_object_object_add(st, "entries", json_object_new_int64((int64_t)rs.entries));
        json_object_object_add(st, "bytes", json_object_new_int64((int64_t)rs.bytes));
        json_object_object_add(st, "max_bytes", json_object_new_int64((int64_t)rs.max_bytes));
        json_object_object_add(st, "ttl_s", json_object_new_int64((int64_t)rs.ttl_s));
        json_object_object_add(st, "evictions", json_object_new_int64((int64_t)rs.evictions));
        json_object_object_add(st, "expirations",
                               json_object_new_int64((int64_t)rs.expirations));
        json_object_object_add(root, "response_store", st);
    }
    if (srv->pool)
        json_object_object_add(root, "pool", pool_json(srv->pool));
    served_model_release(srv, held);
    size_t len;
    const char *s = json_object_to_json_string_length(
        root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    strbuf_append(out, s ? s : "{}", s ? len : 2);
    json_object_put(root);
}
