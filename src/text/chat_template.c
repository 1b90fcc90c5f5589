/* text/chat_template.c — builds the render context transformers passes to a chat template and renders it. */
#include "text/chat_template.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "text/jinja/jinja.h"
#include "text/tokenizer.h"

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

int chat_template_load(const struct tokenizer *tok, struct chat_template *out, struct err *err)
{
    memset(out, 0, sizeof *out);
    const char *src = tok_chat_template(tok);
    if (!src)
        return err_set(err, INFERD_EUNSUPPORTED,
                       "the tokenizer has no chat_template (tokenizer_config.json); "
                       "send a raw prompt instead");
    int rc = jinja_parse(src, strlen(src), &out->tmpl, err);
    if (rc < 0)
        return err_wrap(err, "chat template");
    out->bos_token = dup_or_null(tok_bos_token(tok));
    out->eos_token = dup_or_null(tok_eos_token(tok));
    if ((tok_bos_token(tok) && !out->bos_token) || (tok_eos_token(tok) && !out->eos_token)) {
        chat_template_free(out);
        return err_set(err, INFERD_ENOMEM, "out of memory loading the chat template");
    }
    return 0;
}

void chat_template_free(struct chat_template *ct)
{
    jinja_free(ct->tmpl);
    free(ct->bos_token);
    free(ct->eos_token);
    memset(ct, 0, sizeof *ct);
}

int chat_template_render(const struct chat_template *ct, struct json_object *messages,
                         struct json_object *tools, bool add_generation_prompt,
                         struct json_object *kwargs, char **out, size_t *len, struct err *err)
{
    if (!json_object_is_type(messages, json_type_array))
        return err_set(err, INFERD_EINVAL, "messages must be an array");
    struct json_object *ctx = json_object_new_object();
    if (!ctx)
        return err_set(err, INFERD_ENOMEM, "out of memory building the template context");
    json_object_object_add(ctx, "messages", json_object_get(messages));
    if (tools)
        json_object_object_add(ctx, "tools", json_object_get(tools));
    json_object_object_add(ctx, "add_generation_prompt",
                           json_object_new_boolean(add_generation_prompt));
    json_object_object_add(ctx, "bos_token",
                           ct->bos_token ? json_object_new_string(ct->bos_token) : NULL);
    json_object_object_add(ctx, "eos_token",
                           ct->eos_token ? json_object_new_string(ct->eos_token) : NULL);
    if (kwargs && json_object_is_type(kwargs, json_type_object)) {
        json_object_object_foreach(kwargs, key, value)
            json_object_object_add(ctx, key, json_object_get(value));
    }
    struct jinja_limits limits;
    jinja_limits_default(&limits);
    int rc = jinja_render(ct->tmpl, ctx, &limits, out, len, err);
    json_object_put(ctx);
    return rc;
}

int chat_template_join_content(struct json_object *messages, struct json_object **out,
                               struct err *err)
{
    *out = NULL;
    if (!json_object_is_type(messages, json_type_array))
        return err_set(err, INFERD_EINVAL, "messages is not an array");
    json_object *copy = NULL;
    if (json_object_deep_copy(messages, &copy, NULL) != 0)
        return err_set(err, INFERD_ENOMEM, "out of memory copying the messages");
    size_t n = json_object_array_length(copy);
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(copy, i), *content = NULL;
        bool present = json_object_object_get_ex(m, "content", &content);
        if (present && content == NULL) {
            json_object_object_add(m, "content", json_object_new_string(""));
        } else if (json_object_is_type(content, json_type_array)) {
            struct strbuf text = {0};
            bool only_text = true;
            size_t n_parts = json_object_array_length(content);
            for (size_t k = 0; k < n_parts; k++) {
                json_object *part = json_object_array_get_idx(content, k), *t = NULL;
                if (json_object_object_get_ex(part, "text", &t) && json_object_is_type(t, json_type_string))
                    strbuf_append(&text, json_object_get_string(t), (size_t)json_object_get_string_len(t));
                else
                    only_text = false;
            }
            if (only_text && !text.failed)
                json_object_object_add(m, "content",
                                       json_object_new_string_len(text.data ? text.data : "", (int)text.len));
            strbuf_free(&text);
        }
    }
    *out = copy;
    return 0;
}
