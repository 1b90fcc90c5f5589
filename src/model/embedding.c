/* model/embedding.c — how a model directory says its embeddings are pooled: sentence-transformers' modules.json, its Pooling module's config and a Normalize module. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "model/model.h"

#define EMBED_MAX_FILE_BYTES (1u << 20)

/* The Pooling module's config.json: the one pooling_mode_* set to true
 * names the mode (several: the first is named, and it is not last-token). */
static int read_pooling(const char *dir, const char *module, struct model_embedding *out,
                        struct err *err)
{
    static const char *const modes[] = {"lasttoken", "cls_token", "mean_tokens", "max_tokens",
                                        "mean_sqrt_len_tokens", "weightedmean_tokens"};
    char path[4200];
    snprintf(path, sizeof path, "%s/%s/config.json", dir, module);
    char *text = NULL;
    size_t len = 0;
    bool missing = false;
    int rc = file_read_all(path, EMBED_MAX_FILE_BYTES, &text, &len, &missing, err);
    if (rc || missing)
        return rc ? rc : err_set(err, INFERD_EFORMAT, "%s is missing (modules.json names it)", path);
    json_object *root = NULL;
    rc = json_text_parse(text, len, 0, false, &root, err);
    free(text);
    if (rc)
        return err_wrap(err, "%s", path);
    int n_on = 0;
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        char key[64];
        snprintf(key, sizeof key, "pooling_mode_%s", modes[i]);
        json_object *v = json_object_object_get(root, key);
        if (v && json_object_get_boolean(v)) {
            if (n_on++ == 0)
                snprintf(out->mode, sizeof out->mode, "%s", modes[i]);
        }
    }
    json_object_put(root);
    out->pooling = n_on == 1 && !strcmp(out->mode, "lasttoken") ? MODEL_POOLING_LAST_TOKEN
                                                               : MODEL_POOLING_OTHER;
    if (n_on == 0)
        snprintf(out->mode, sizeof out->mode, "none");
    return 0;
}

int model_embedding_load(const char *dir, struct model_embedding *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    char path[4200];
    snprintf(path, sizeof path, "%s/modules.json", dir);
    char *text = NULL;
    size_t len = 0;
    bool missing = false;
    int rc = file_read_all(path, EMBED_MAX_FILE_BYTES, &text, &len, &missing, err);
    if (rc || missing)
        return rc;
    json_object *root = NULL;
    rc = json_text_parse(text, len, 0, false, &root, err);
    free(text);
    if (rc)
        return err_wrap(err, "%s", path);
    if (!json_object_is_type(root, json_type_array)) {
        json_object_put(root);
        return err_set(err, INFERD_EFORMAT, "%s is not a list of modules", path);
    }
    char pooling_path[256] = "";
    for (size_t i = 0; i < json_object_array_length(root); i++) {
        json_object *m = json_object_array_get_idx(root, i);
        const char *type = json_object_get_string(json_object_object_get(m, "type"));
        const char *mpath = json_object_get_string(json_object_object_get(m, "path"));
        if (!type)
            continue;
        if (strstr(type, "models.Pooling") && mpath)
            snprintf(pooling_path, sizeof pooling_path, "%s", mpath);
        if (strstr(type, "models.Normalize"))
            out->normalize = true;
    }
    json_object_put(root);
    if (!pooling_path[0] || strstr(pooling_path, "..")) {
        out->pooling = MODEL_POOLING_OTHER;
        snprintf(out->mode, sizeof out->mode, "%s", pooling_path[0] ? "unreadable" : "none");
        return 0;
    }
    return read_pooling(dir, pooling_path, out, err);
}
