/* tests/unit/test_errors.c — the error record and its OpenAI rendering: the exact bytes clients
 * have always received, the kind each status implies, and the fixed body for when memory runs
 * out. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/errors.h"
#include "base/err.h"

static char *render(const struct api_error *e)
{
    struct strbuf b = {0};
    cr_assert_eq(api_error_render_openai(e, &b), 0);
    cr_assert_not_null(b.data);
    return b.data;
}

Test(errors, openai_body_names_message_type_param_and_code_in_that_order)
{
    struct api_error e;
    api_error_set(&e, 400, API_ERROR_INVALID_REQUEST, "messages[2].role", "bad_role",
                  "role must be one of %s", "system, user");
    char *json = render(&e);
    cr_assert_str_eq(json, "{\"error\":{\"message\":\"role must be one of system, user\","
                           "\"type\":\"invalid_request_error\",\"param\":\"messages[2].role\","
                           "\"code\":\"bad_role\"}}");
    free(json);
}

Test(errors, empty_param_and_code_are_null_and_quotes_and_slashes_are_escaped_as_before)
{
    struct api_error e;
    api_error_set(&e, 400, API_ERROR_INVALID_REQUEST, NULL, NULL, "bad \"x\" in a/b");
    char *json = render(&e);
    cr_assert_str_eq(json, "{\"error\":{\"message\":\"bad \\\"x\\\" in a/b\","
                           "\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}");
    free(json);
}

/* The OpenAI type each kind is written as. */
static const char *openai_type_of(int status, enum api_error_kind kind)
{
    static char type[64];
    struct api_error e;
    api_error_set(&e, status, kind, NULL, NULL, "m");
    char *json = render(&e);
    json_object *root = json_tokener_parse(json), *err = NULL, *t = NULL;
    cr_assert_not_null(root, "%s", json);
    cr_assert(json_object_object_get_ex(root, "error", &err));
    cr_assert(json_object_object_get_ex(err, "type", &t));
    snprintf(type, sizeof type, "%s", json_object_get_string(t));
    json_object_put(root);
    free(json);
    return type;
}

Test(errors, openai_folds_kinds_into_its_three_types)
{
    cr_assert_str_eq(openai_type_of(400, API_ERROR_INVALID_REQUEST), "invalid_request_error");
    cr_assert_str_eq(openai_type_of(401, API_ERROR_AUTHENTICATION), "invalid_request_error");
    cr_assert_str_eq(openai_type_of(404, API_ERROR_NOT_FOUND), "invalid_request_error");
    cr_assert_str_eq(openai_type_of(429, API_ERROR_RATE_LIMIT), "rate_limit_error");
    cr_assert_str_eq(openai_type_of(500, API_ERROR_SERVER), "server_error");
    cr_assert_str_eq(openai_type_of(503, API_ERROR_UNAVAILABLE), "server_error");
}

Test(errors, an_unset_kind_follows_the_status)
{
    struct api_error e = {.status = 401};
    cr_assert_eq(api_error_kind_of(&e), API_ERROR_AUTHENTICATION);
    e.status = 404;
    cr_assert_eq(api_error_kind_of(&e), API_ERROR_NOT_FOUND);
    e.status = 429;
    cr_assert_eq(api_error_kind_of(&e), API_ERROR_RATE_LIMIT);
    e.status = 503;
    cr_assert_eq(api_error_kind_of(&e), API_ERROR_UNAVAILABLE);
    e.status = 500;
    cr_assert_eq(api_error_kind_of(&e), API_ERROR_SERVER);
    e.status = 413;
    cr_assert_eq(api_error_kind_of(&e), API_ERROR_INVALID_REQUEST);
    e.status = 400;
    cr_assert_eq(api_error_kind_of(&e), API_ERROR_INVALID_REQUEST);
    e.kind = API_ERROR_UNAVAILABLE;
    cr_assert_eq(api_error_kind_of(&e), API_ERROR_UNAVAILABLE, "a set kind wins over the status");
    e.kind = (enum api_error_kind)1000;
    cr_assert_eq(api_error_kind_of(&e), API_ERROR_INVALID_REQUEST, "a bad kind is not trusted");
}

Test(errors, request_parsing_records_without_a_kind_render_as_before)
{
    /* What request parsing writes: status, OpenAI type, message; kind left zero. */
    struct api_error e = {.status = 500, .type = "server_error", .message = "out of memory"};
    char *json = render(&e);
    cr_assert_str_eq(json, "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                           "\"param\":null,\"code\":null}}");
    free(json);
}

Test(errors, to_json_is_the_openai_rendering)
{
    struct api_error e;
    api_error_set(&e, 429, API_ERROR_RATE_LIMIT, NULL, "rate_limit_exceeded", "queue full");
    char *json = NULL, *rendered = render(&e);
    cr_assert_eq(api_error_to_json(&e, &json), 0);
    cr_assert_str_eq(json, rendered);
    free(json);
    free(rendered);
}

Test(errors, the_out_of_memory_body_is_what_rendering_a_500_would_give)
{
    struct api_error e;
    api_error_set(&e, 500, API_ERROR_SERVER, NULL, NULL, "out of memory");
    char *json = render(&e);
    cr_assert_str_eq(api_error_openai.out_of_memory, json);
    cr_assert_str_eq(api_error_openai.content_type, "application/json");
    cr_assert_eq(api_error_openai.render, api_error_render_openai);
    free(json);
}

Test(errors, set_cuts_long_fields_and_clears_the_type)
{
    struct api_error e;
    memset(&e, 'x', sizeof e);
    char longer[2000];
    memset(longer, 'm', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    api_error_set(&e, 400, API_ERROR_INVALID_REQUEST, longer, longer, "%s", longer);
    cr_assert_eq(strlen(e.message), sizeof e.message - 1);
    cr_assert_eq(strlen(e.param), sizeof e.param - 1);
    cr_assert_eq(strlen(e.code), sizeof e.code - 1);
    cr_assert_str_empty(e.type);
    cr_assert_eq(e.kind, API_ERROR_INVALID_REQUEST);
}
