/* api/adapters.c — the LoRA adapter routes over the served model's registry (engine/adapters.h, in this process or an engine child's): listing, the adapter directory's contents, mounting and unmounting. */
#include "api/adapters.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/engine_proxy.h"
#include "api/model_pool.h"
#include "api/server.h"
#include "base/json.h"
#include "engine/adapters.h"

#define LIST_CAP 64

static void send_object(struct http_exchange *x, int status, json_object *o)
{
    size_t len;
    const char *s = o ? json_object_to_json_string_length(
                            o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len)
                      : NULL;
    if (s)
        http_send_json(x, status, s, len);
    else
        http_send_errorf(x, 500, API_ERROR_SERVER, NULL, NULL, "out of memory for the response");
    json_object_put(o);
}

/* The default model (or the one a body names), held: NULL with the error sent. */
static struct served_model *acquire(struct http_exchange *x, const char *model)
{
    struct served_model *sm = NULL;
    struct api_error e = {0};
    if (served_model_acquire(x->srv, model, &sm, &e) < 0) {
        http_send_error(x, &e);
        return NULL;
    }
    if (!served_adapters_ready(sm)) {
        served_model_release(x->srv, sm);
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, NULL, NULL,
                         "this model's backend cannot run adapters");
        return NULL;
    }
    return sm;
}

static const char *base_name(const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    const char *s = path + n;
    while (s > path && s[-1] != '/')
        s--;
    return s;
}

static json_object *info_json(const struct adapter_info *in)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(in->id));
    json_object_object_add(o, "object", json_object_new_string("adapter"));
    json_object_object_add(o, "path", json_object_new_string(in->path));
    json_object_object_add(o, "rank", json_object_new_int(in->rank));
    json_object_object_add(o, "scale", json_object_new_double(in->scale));
    json_object_object_add(o, "size_bytes", json_object_new_int64((int64_t)in->size_bytes));
    json_object_object_add(o, "mounted_layers", json_object_new_int(in->mounted_modules));
    json_object_object_add(o, "ram_bytes", json_object_new_int64((int64_t)in->ram_bytes));
    json_object_object_add(o, "in_use", json_object_new_int(in->users));
    return o;
}

/* A registry call that failed for want of its engine (a child restarting) or memory. */
static void send_unavailable(struct http_exchange *x, const struct err *err)
{
    http_send_errorf(x, 503, API_ERROR_UNAVAILABLE, NULL, "engine_unavailable", "%s", err->msg);
}

void adapters_list(struct http_exchange *x)
{
    struct served_model *sm = acquire(x, NULL);
    if (!sm)
        return;
    struct err err = {0};
    struct adapter_info *in = calloc(LIST_CAP, sizeof *in);
    int n = in ? served_adapters_list(sm, in, LIST_CAP, &err)
               : err_set(&err, INFERD_ENOMEM, "out of memory");
    served_model_release(x->srv, sm);
    if (n < 0) {
        free(in);
        send_unavailable(x, &err);
        return;
    }
    json_object *root = json_object_new_object(), *list = json_object_new_array();
    for (int i = 0; i < n && i < LIST_CAP; i++)
        json_object_array_add(list, info_json(&in[i]));
    free(in);
    json_object_object_add(root, "object", json_object_new_string("list"));
    json_object_object_add(root, "adapters", list);
    send_object(x, 200, root);
}

void adapters_get(struct http_exchange *x)
{
    if (strcmp(x->id, "available") != 0) {
        http_send_errorf(x, 404, API_ERROR_NOT_FOUND, NULL, NULL, "not found");
        return;
    }
    struct served_model *sm = acquire(x, NULL);
    if (!sm)
        return;
    struct err err = {0};
    struct adapter_found *f = calloc(LIST_CAP, sizeof *f);
    int n = f ? served_adapters_available(sm, f, LIST_CAP, &err)
              : err_set(&err, INFERD_ENOMEM, "out of memory");
    if (n < 0) {
        free(f);
        served_model_release(x->srv, sm);
        send_unavailable(x, &err);
        return;
    }
    json_object *root = json_object_new_object(), *list = json_object_new_array();
    for (int i = 0; i < n && i < LIST_CAP; i++) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "id", json_object_new_string(f[i].id));
        json_object_object_add(o, "path", json_object_new_string(f[i].path));
        json_object_object_add(o, "base_model", json_object_new_string(f[i].base_model));
        json_object_object_add(o, "rank", json_object_new_int(f[i].rank));
        json_object_object_add(o, "mounted", json_object_new_boolean(f[i].mounted));
        /* by name only: mounting checks every shape against the weights */
        bool compatible = !f[i].base_model[0] ||
                          !strcmp(base_name(f[i].base_model), base_name(sm->id));
        json_object_object_add(o, "compatible", json_object_new_boolean(compatible));
        json_object_array_add(list, o);
    }
    free(f);
    served_model_release(x->srv, sm);
    json_object_object_add(root, "object", json_object_new_string("list"));
    json_object_object_add(root, "adapters", list);
    send_object(x, 200, root);
}

void adapters_mount(struct http_exchange *x)
{
    struct err err = {0};
    struct json_object *root = NULL;
    if (json_text_parse(x->body, x->body_len, 0, true, &root, &err) < 0) {
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, NULL, NULL,
                         "the body is not valid JSON: %s", err.msg);
        return;
    }
    json_object *id = NULL, *path = NULL, *model = NULL;
    bool obj = root && json_object_is_type(root, json_type_object);
    if (obj) {
        json_object_object_get_ex(root, "id", &id);
        json_object_object_get_ex(root, "path", &path);
        json_object_object_get_ex(root, "model", &model);
    }
    if (!obj || !json_object_is_type(id, json_type_string) ||
        !json_object_is_type(path, json_type_string) || !*json_object_get_string(path)) {
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, NULL, NULL, "id and path required");
        json_object_put(root);
        return;
    }
    struct served_model *sm =
        acquire(x, json_object_is_type(model, json_type_string) ? json_object_get_string(model)
                                                                 : NULL);
    if (!sm) {
        json_object_put(root);
        return;
    }
    struct adapter_info in;
    int rc = served_adapters_mount(sm, json_object_get_string(id), json_object_get_string(path),
                                   &in, &err);
    served_model_release(x->srv, sm);
    json_object_put(root);
    if (rc == -INFERD_EEXIST)
        http_send_errorf(x, 409, API_ERROR_INVALID_REQUEST, "id", "adapter_exists", "%s", err.msg);
    else if (rc == -INFERD_EBUSY)
        http_send_errorf(x, 503, API_ERROR_UNAVAILABLE, NULL, NULL, "%s", err.msg);
    else if (rc == -INFERD_ENOMEM)
        http_send_errorf(x, 507, API_ERROR_SERVER, NULL, "out_of_memory", "%s", err.msg);
    else if (rc < 0)
        http_send_errorf(x, 400, API_ERROR_INVALID_REQUEST, "path", "invalid_adapter", "%s",
                         err.msg);
    else {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "id", json_object_new_string(in.id));
        json_object_object_add(o, "mounted_layers", json_object_new_int(in.mounted_modules));
        json_object_object_add(o, "rank", json_object_new_int(in.rank));
        json_object_object_add(o, "scale", json_object_new_double(in.scale));
        json_object_object_add(o, "ram_bytes", json_object_new_int64((int64_t)in.ram_bytes));
        send_object(x, 200, o);
    }
}

void adapters_unmount(struct http_exchange *x)
{
    struct served_model *sm = acquire(x, NULL);
    if (!sm)
        return;
    struct err err = {0};
    int removed = 0;
    int rc = served_adapters_unmount(sm, x->id, &removed, &err);
    served_model_release(x->srv, sm);
    if (rc == -INFERD_ENOENT)
        http_send_errorf(x, 404, API_ERROR_NOT_FOUND, NULL, "adapter_not_found", "%s", err.msg);
    else if (rc == -INFERD_EBUSY)
        http_send_errorf(x, 409, API_ERROR_INVALID_REQUEST, NULL, "adapter_in_use", "%s", err.msg);
    else if (rc < 0)
        http_send_errorf(x, 503, API_ERROR_UNAVAILABLE, NULL, NULL, "%s", err.msg);
    else {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "id", json_object_new_string(x->id));
        json_object_object_add(o, "removed_layers", json_object_new_int(removed));
        json_object_object_add(o, "deleted", json_object_new_boolean(true));
        send_object(x, 200, o);
    }
}
