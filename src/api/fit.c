/* api/fit.c — GET /fit and the arithmetic of a memory budget: weights + transient buffers +
 * KV per position against the bytes there are. */
#include "api/fit.h"

#include <json-c/json.h>

#include "api/engine_proxy.h"
#include "api/model_pool.h"

int64_t fit_max_context(uint64_t memory, uint64_t weights, uint64_t transient,
                        uint64_t kv_bytes_per_token)
{
    if (kv_bytes_per_token == 0 || weights > memory || transient > memory - weights)
        return 0;
    uint64_t n = (memory - weights - transient) / kv_bytes_per_token;
    return n > INT64_MAX ? INT64_MAX : (int64_t)n;
}

static json_object *jbytes(uint64_t n)
{
    return json_object_new_int64(n > INT64_MAX ? INT64_MAX : (int64_t)n);
}

void fit_report(struct http_exchange *x)
{
    const struct server *srv = x->srv;
    /* The default model's, as it was measured at its load when it is not resident now. */
    struct served_model *sm = served_model_peek(srv);
    const struct server_fit *f = sm ? &sm->fit : &srv->served.fit;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "weights_bytes", jbytes(f->weights_bytes));
    json_object_object_add(o, "kv_bytes_per_token", jbytes(f->kv_bytes_per_token));
    json_object_object_add(o, "transient_bytes", jbytes(f->transient_bytes));
    json_object_object_add(o, "memory_budget_bytes",
                           f->memory_budget_bytes ? jbytes(f->memory_budget_bytes) : NULL);
    json_object_object_add(o, "max_safe_context", json_object_new_int64(f->max_safe_context));
    if (served_engine_ready(sm))
        json_object_object_add(o, "enforced_context_tokens",
                               json_object_new_int(served_engine_config(sm)->n_ctx));
    /* A decode step reads every weight once: bandwidth bounds tokens per second. */
    double tps = f->bandwidth_gbs > 0 && f->weight_bytes_per_token > 0
                     ? f->bandwidth_gbs * 1e9 / f->weight_bytes_per_token
                     : 0;
    json_object_object_add(o, "predicted_decode_tps", json_object_new_double(tps));
    json_object_object_add(o, "bandwidth_gbs", json_object_new_double(f->bandwidth_gbs));
    json_object *be = json_object_new_object();
    json_object_object_add(be, "name", json_object_new_string(f->backend_name));
    json_object_object_add(be, "device", json_object_new_string(f->backend_device));
    json_object_object_add(be, "memory_bytes", jbytes(f->memory_bytes));
    json_object_object_add(o, "backend", be);
    served_model_release(srv, sm);
    size_t len;
    const char *s = json_object_to_json_string_length(
        o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    if (s)
        http_send_json(x, 200, s, len);
    else
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for /fit");
    json_object_put(o);
}
