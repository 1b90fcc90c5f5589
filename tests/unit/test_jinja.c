/* tests/unit/test_jinja.c — the Jinja interpreter: whitespace control, loops, scoping, macros, filters, tests,
 * Python value semantics, errors with positions, limits, and the real Qwen3 / Llama 3 / Gemma 3 chat templates.
 * Expected outputs of the small templates are what jinja2 3.1 renders when set up as transformers does
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, tojson = json.dumps with
 * ensure_ascii=False); the real-template outputs are @huggingface/jinja 0.5.11's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <json-c/json.h>

#include "text/jinja/jinja.h"

/* Renders tpl with the JSON context; returns 0 and the output, or the error code with err filled. */
static int render(const char *tpl, const char *ctx_json, const struct jinja_limits *lim, char **out,
                  struct err *err)
{
    struct jinja_template *t = NULL;
    *out = NULL;
    int rc = jinja_parse(tpl, strlen(tpl), &t, err);
    if (rc)
        return rc;
    struct json_object *ctx = json_tokener_parse(ctx_json);
    cr_assert(ctx != NULL, "bad test context JSON: %s", ctx_json);
    size_t len = 0;
    rc = jinja_render(t, ctx, lim, out, &len, err);
    if (rc == 0)
        cr_assert_eq(len, strlen(*out), "length must match the NUL-terminated output");
    json_object_put(ctx);
    jinja_free(t);
    return rc;
}

static void expect_render(const char *tpl, const char *ctx_json, const char *expected)
{
    char *out;
    struct err err = {0};
    int rc = render(tpl, ctx_json, NULL, &out, &err);
    cr_assert_eq(rc, 0, "template %s failed: %s", tpl, err.msg);
    cr_expect_str_eq(out, expected, "template: %s", tpl);
    free(out);
}

/* Expects parse or render to fail with a message containing want. */
static void expect_error(const char *tpl, const char *ctx_json, const struct jinja_limits *lim, const char *want)
{
    char *out;
    struct err err = {0};
    int rc = render(tpl, ctx_json, lim, &out, &err);
    cr_assert_neq(rc, 0, "template %s should fail but rendered %s", tpl, out ? out : "");
    cr_assert_eq(rc, -err.code, "return code and err.code must agree");
    cr_expect(strstr(err.msg, want) != NULL, "error for %s is \"%s\", expected it to contain \"%s\"", tpl,
              err.msg, want);
}

static char *read_chat_template(const char *model)
{
    const char *dir = getenv("INFERD_TOKENIZER_DATA");
    if (!dir || !*dir)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set; run scripts/fetch-tokenizers.sh DIR and export it");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/tokenizer_config.json", dir, model);
    struct json_object *cfg = json_object_from_file(path);
    if (!cfg)
        cr_skip_test("%s is missing; run scripts/fetch-tokenizers.sh %s", path, dir);
    struct json_object *tpl;
    cr_assert(json_object_object_get_ex(cfg, "chat_template", &tpl) && json_object_is_type(tpl, json_type_string),
              "%s has no chat_template string", path);
    char *s = strdup(json_object_get_string(tpl));
    json_object_put(cfg);
    return s;
}

static void expect_real_template(const char *model, const char *ctx_json, const char *expected)
{
    char *tpl = read_chat_template(model);
    expect_render(tpl, ctx_json, expected);
    free(tpl);
}

Test(jinja_real_gemma3, roles_that_do_not_alternate_raise_the_templates_message)
{
    char *tpl = read_chat_template("gemma3");
    expect_error(tpl,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", "
                 "\"content\": \"b\"}], \"bos_token\": \"<bos>\", \"add_generation_prompt\": true}",
                 NULL, "Conversation roles must alternate user/assistant/user/assistant/...");
    free(tpl);
}

/* ---- behaviour beyond what the sandboxed jinja2 allows, or where transformers' setup differs ---- */

Test(jinja_text, attribute_and_item_of_undefined_are_undefined)
{
    expect_render("[{{ nope }}][{{ nope.attr }}][{{ nope['k'].x }}][{{ nope.attr is defined }}]", "{}",
                  "[][][][False]");
}

Test(jinja_set, list_append_and_index_on_in_template_lists)
{
    expect_render("{% set l = [] %}{% for x in range(3) %}{% set _ = l.append(x * 2) %}{% endfor %}"
                  "{{ l }} {{ l.index(4) }}",
                  "{}", "[0, 2, 4] 2");
}

Test(jinja_set, do_and_generation_tags)
{
    expect_render("{% set l = [1] %}{% do l.append(2) %}{% generation %}{{ l }}{% endgeneration %}", "{}", "[1, 2]");
}

Test(jinja_global, strftime_now_formats_the_current_time)
{
    char *out;
    struct err err = {0};
    cr_assert_eq(render("{{ strftime_now('%Y') }}", "{}", NULL, &out, &err), 0, "%s", err.msg);
    cr_expect_eq(strlen(out), 4);
    cr_expect(out[0] == '2', "year %s", out);
    free(out);
}

Test(jinja_global, raise_exception_fails_with_the_message)
{
    expect_error("{% if messages|length > 1 %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}",
                 "{\"messages\": [1, 2]}", NULL, "Conversation roles must alternate");
}

Test(jinja_global, context_must_be_an_object)
{
    expect_error("x", "[1]", NULL, "context must be a JSON object");
}

Test(jinja_global, null_context_renders_with_no_variables)
{
    struct jinja_template *t;
    struct err err = {0};
    cr_assert_eq(jinja_parse("a{{ x }}b", strlen("a{{ x }}b"), &t, &err), 0);
    char *out;
    size_t len;
    cr_assert_eq(jinja_render(t, NULL, NULL, &out, &len, &err), 0, "%s", err.msg);
    cr_expect_str_eq(out, "ab");
    free(out);
    jinja_free(t);
}

Test(jinja_text, template_outlives_its_source_buffer)
{
    char *src = strdup("a {{ x }} {% for c in 'xy' %}{{ c }}{% endfor %}");
    struct jinja_template *t;
    struct err err = {0};
    cr_assert_eq(jinja_parse(src, strlen(src), &t, &err), 0, "%s", err.msg);
    memset(src, '#', strlen(src));
    free(src);
    struct json_object *ctx = json_tokener_parse("{\"x\": 1}");
    char *out;
    size_t len;
    cr_assert_eq(jinja_render(t, ctx, NULL, &out, &len, &err), 0, "%s", err.msg);
    cr_expect_str_eq(out, "a 1 xy");
    free(out);
    json_object_put(ctx);
    jinja_free(t);
}

/* ---- parse errors say line and column ---- */

Test(jinja_errors, parse_error_reports_line_and_column)
{
    expect_error("line1\n{% if x %}\n  {{ x + }}\n{% endif %}", "{}", NULL, "line 3, column 10: unexpected '}}'");
}

Test(jinja_errors, unclosed_block_points_at_its_opening_tag)
{
    expect_error("a\n{% for x in y %}\nno end", "{}", NULL, "line 2, column 4: missing 'endfor'");
}

Test(jinja_errors, stray_end_tag)
{
    expect_error("{% if x %}{% endfor %}", "{}", NULL, "line 1, column 14: unexpected 'endfor'");
}

Test(jinja_errors, unterminated_string_and_unknown_tag)
{
    expect_error("x\n  {{ 'unterminated }}", "{}", NULL, "line 2, column 6: unterminated string");
    expect_error("{% frob %}", "{}", NULL, "line 1, column 4: unknown tag 'frob'");
    expect_error("{{ x", "{}", NULL, "line 1, column 1: unclosed '{{'");
    expect_error("{# x", "{}", NULL, "unclosed comment");
}

Test(jinja_errors, unknown_filter_or_test_is_a_parse_error)
{
    expect_error("{{ x | nosuch }}", "{}", NULL, "line 1, column 8: no filter named 'nosuch'");
    expect_error("{{ x is frob }}", "{}", NULL, "line 1, column 9: no test named 'frob'");
}

Test(jinja_errors, deep_nesting_is_rejected_not_overflowing_the_stack)
{
    char tpl[4096];
    size_t k = 0;
    tpl[k++] = '{';
    tpl[k++] = '{';
    for (int i = 0; i < 1000; i++)
        tpl[k++] = '(';
    tpl[k++] = '1';
    for (int i = 0; i < 1000; i++)
        tpl[k++] = ')';
    tpl[k++] = '}';
    tpl[k++] = '}';
    tpl[k] = 0;
    expect_error(tpl, "{}", NULL, "nested too deeply");
}

/* ---- runtime errors name the construct ---- */

Test(jinja_errors, runtime_errors_name_the_construct)
{
    expect_error("{{ 1 / 0 }}", "{}", NULL, "line 1, column 6: division by zero");
    expect_error("{{ undefined_fn() }}", "{}", NULL, "'undefined_fn' is undefined");
    expect_error("{% set ns = 5 %}{% set ns.a = 1 %}", "{}", NULL, "not a namespace");
    expect_error("{{ [1,2] + 'a' }}", "{}", NULL, "unsupported operand types for +: 'list' and 'str'");
    expect_error("{% for x in 5 %}{% endfor %}", "{}", NULL, "'int' object is not iterable");
    expect_error("{{ x|tojson }}", "{}", NULL, "cannot serialize an undefined value");
    expect_error("{% for a, b in [[1, 2, 3]] %}{% endfor %}", "{}", NULL, "cannot unpack 3 values into 2 names");
    expect_error("{{ 'a' < 1 }}", "{}", NULL, "'<' not supported between 'str' and 'int'");
    expect_error("{{ 9223372036854775807 + 1 }}", "{}", NULL, "integer overflow");
}

/* ---- limits ---- */

Test(jinja_limits, huge_range_loop_stops_at_the_step_limit)
{
    expect_error("{% for i in range(100000000) %}{{ i }}{% endfor %}", "{}", NULL, "step limit");
}

Test(jinja_limits, nested_loops_stop_at_the_step_limit)
{
    struct jinja_limits lim;
    jinja_limits_default(&lim);
    lim.max_steps = 100000;
    expect_error("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", "{}", &lim,
                 "step limit");
}

Test(jinja_limits, recursive_macro_stops_at_the_depth_limit)
{
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}", NULL, "recursion deeper than 256");
}

Test(jinja_limits, output_size_is_capped)
{
    struct jinja_limits lim;
    jinja_limits_default(&lim);
    lim.max_output_bytes = 1000;
    expect_error("{% for i in range(100) %}0123456789{{ i }}{% endfor %}", "{}", &lim, "output exceeds the limit");
    expect_error("{{ 'x' * 5000 }}", "{}", &lim, "larger than the output limit");
}

Test(jinja_limits, deep_statement_nesting_inside_recursion_cannot_exhaust_the_stack)
{
    char *tpl = malloc(16384);
    size_t k = (size_t)sprintf(tpl, "{%% macro f(n) %%}");
    for (int i = 0; i < 150; i++)
        k += (size_t)sprintf(tpl + k, "{%% if true %%}");
    k += (size_t)sprintf(tpl + k, "{{ f(n + 1) }}");
    for (int i = 0; i < 150; i++)
        k += (size_t)sprintf(tpl + k, "{%% endif %%}");
    sprintf(tpl + k, "{%% endmacro %%}{{ f(0) }}");
    expect_error(tpl, "{}", NULL, "nested too deeply at run time");
    free(tpl);
}

Test(jinja_limits, self_containing_list_cannot_print_forever)
{
    expect_error("{% set l = [] %}{% do l.append(l) %}{{ l }}", "{}", NULL, "nested too deeply");
}

Test(jinja_limits, template_is_reusable_after_a_failed_render)
{
    struct jinja_template *t;
    struct err err = {0};
    const char *src = "{{ x.y if x else raise_exception('no x') }}";
    cr_assert_eq(jinja_parse(src, strlen(src), &t, &err), 0);
    struct json_object *bad = json_tokener_parse("{}"), *good = json_tokener_parse("{\"x\": {\"y\": 1.5}}");
    char *out;
    size_t len;
    cr_expect_neq(jinja_render(t, bad, NULL, &out, &len, &err), 0);
    cr_expect_str_eq(err.msg, "no x");
    cr_assert_eq(jinja_render(t, good, NULL, &out, &len, &err), 0, "%s", err.msg);
    cr_expect_str_eq(out, "1.5");
    free(out);
    json_object_put(bad);
    json_object_put(good);
    jinja_free(t);
}

/* ---- behaviour checked against jinja2 3.1 ---- */

Test(jinja_text, plain_text_passes_through)
{
    expect_render("hello world",
        "{}",
        "hello world");
}

Test(jinja_text, variable_output)
{
    expect_render("Hello {{ name }}!",
        "{\"name\": \"Bob\"}",
        "Hello Bob!");
}

Test(jinja_text, comment_is_dropped)
{
    expect_render("a{# note #}b",
        "{}",
        "ab");
}

Test(jinja_text, raw_block_keeps_tags)
{
    expect_render("{% raw %}{{ x }}{% if %}{% endraw %}",
        "{}",
        "{{ x }}{% if %}");
}

Test(jinja_text, undefined_renders_empty)
{
    expect_render("[{{ nope }}][{{ nope|default('d') }}]",
        "{}",
        "[][d]");
}

Test(jinja_ws, trim_blocks_eats_newline_after_block)
{
    expect_render("{% if true %}\n"
        "yes\n"
        "{% endif %}\n"
        "end",
        "{}",
        "yes\n"
        "end");
}

Test(jinja_ws, lstrip_blocks_strips_indent_before_block)
{
    expect_render("a\n"
        "    {% if true %}\n"
        "    x\n"
        "    {% endif %}\n"
        "b",
        "{}",
        "a\n"
        "    x\n"
        "b");
}

Test(jinja_ws, minus_strips_both_sides)
{
    expect_render("a   {%- if true -%}   b   {%- endif -%}   c",
        "{}",
        "abc");
}

Test(jinja_ws, var_minus_strips)
{
    expect_render("a \n"
        " {{- 'x' -}} \n"
        " b",
        "{}",
        "axb");
}

Test(jinja_ws, plus_disables_lstrip)
{
    expect_render("a\n"
        "    {%+ if true %}x{% endif %}",
        "{}",
        "a\n"
        "    x");
}

Test(jinja_ws, variable_tags_are_not_lstripped)
{
    expect_render("a\n"
        "    {{ 'x' }}\n",
        "{}",
        "a\n"
        "    x");
}

Test(jinja_ws, one_trailing_newline_dropped)
{
    expect_render("a\n"
        "\n",
        "{}",
        "a\n");
}

Test(jinja_ws, comment_trimmed_like_block)
{
    expect_render("a\n"
        "  {# c #}\n"
        "b",
        "{}",
        "a\n"
        "b");
}

Test(jinja_ws, lstrip_only_when_line_is_blank)
{
    expect_render("x {% if true %}y{% endif %}",
        "{}",
        "x y");
}

Test(jinja_ws, for_loop_lines)
{
    expect_render("{% for m in messages %}\n"
        "  {{ m.role }}: {{ m.content }}\n"
        "{% endfor %}\n",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
        "\"Hi\"}]}",
        "  system: Be brief.\n"
        "  user: Hi\n");
}

Test(jinja_loop, loop_variables)
{
    expect_render("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ "
        "loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
        "{}",
        "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;");
}

Test(jinja_loop, previtem_nextitem)
{
    expect_render("{% for x in [1,2,3] %}{{ loop.previtem|default('-') }}{{ x }}{{ loop.nextitem|default('-') "
        "}} {% endfor %}",
        "{}",
        "-12 123 23- ");
}

Test(jinja_loop, cycle)
{
    expect_render("{% for x in range(5) %}{{ loop.cycle('a','b') }}{% endfor %}",
        "{}",
        "ababa");
}

Test(jinja_loop, else_runs_on_empty)
{
    expect_render("{% for x in [] %}x{% else %}empty{% endfor %}",
        "{}",
        "empty");
}

Test(jinja_loop, dict_items_unpacking)
{
    expect_render("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}",
        "{\"d\": {\"b\": 1, \"a\": 2, \"c\": 3}}",
        "b=1,a=2,c=3,");
}

Test(jinja_loop, dict_iteration_gives_keys)
{
    expect_render("{% for k in d %}{{ k }}{% endfor %}",
        "{\"d\": {\"z\": 1, \"y\": 2}}",
        "zy");
}

Test(jinja_loop, loop_filter)
{
    expect_render("{% for x in range(10) if x is odd %}{{ x }}{{ loop.index }} {% endfor %}",
        "{}",
        "11 32 53 74 95 ");
}

Test(jinja_loop, break_and_continue)
{
    expect_render("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% "
        "endif %}{{ x }}{% endfor %}",
        "{}",
        "0134");
}

Test(jinja_loop, scoping_needs_namespace)
{
    expect_render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for x in range(3) %}{% set n = n + 1 %}{% set "
        "ns.n = ns.n + 1 %}{% endfor %}{{ n }} {{ ns.n }}",
        "{}",
        "0 3");
}

Test(jinja_loop, nested_loops)
{
    expect_render("{% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ loop.index "
        "}}|{% endfor %}",
        "{}",
        "1x1 1y2 1|2x1 2y2 2|");
}

Test(jinja_loop, tuple_unpack_list_of_pairs)
{
    expect_render("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }} {% endfor %}",
        "{}",
        "3 7 ");
}

Test(jinja_expr, arithmetic)
{
    expect_render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 "
        "** 10 }} {{ 7 / 2 }} {{ 4 / 2 }}",
        "{}",
        "7 9 3 -4 1 2 1024 3.5 2.0");
}

Test(jinja_expr, float_repr)
{
    expect_render("{{ 1.0 }} {{ 0.1 }} {{ 1e-05 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 123456789.0 }} {{ 2.5e-3 }} {{ "
        "1/3 }}",
        "{}",
        "1.0 0.1 1e-05 0.30000000000000004 1e+16 123456789.0 0.0025 0.3333333333333333");
}

Test(jinja_expr, python_literals_print_capitalised)
{
    expect_render("{{ true }} {{ false }} {{ none }} {{ [1, 'a', none, true] }} {{ {'k': 'v', 'n': 1.5} }} {{ "
        "(1,) }} {{ ('a', 2) }}",
        "{}",
        "True False None [1, 'a', None, True] {'k': 'v', 'n': 1.5} (1,) ('a', 2)");
}

Test(jinja_expr, string_repeat_and_concat)
{
    expect_render("{{ 'ab' * 3 }} {{ 'x' ~ 1 ~ none }} {{ 'a' + 'b' }} {{ [1] + [2] }}",
        "{}",
        "ababab x1None ab [1, 2]");
}

Test(jinja_expr, comparisons_and_in)
{
    expect_render("{{ 1 < 2 < 3 }} {{ 'a' in 'cat' }} {{ 3 not in [1,2] }} {{ 'k' in {'k': 1} }} {{ 1 == 1.0 }} "
        "{{ 'a' != 'a' }}",
        "{}",
        "True True True True True False");
}

Test(jinja_expr, and_or_return_operands)
{
    expect_render("{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ none or [] }} {{ not 0 }}",
        "{}",
        "x b [] True");
}

Test(jinja_expr, ternary)
{
    expect_render("{{ 'y' if x else 'n' }} {{ 'y' if not x else 'n' }} [{{ 'only' if false }}]",
        "{\"x\": true}",
        "y n []");
}

Test(jinja_expr, slicing)
{
    expect_render("{{ s[1:3] }} {{ s[::-1] }} {{ s[-2:] }} {{ l[::2] }} {{ l[::-1] }} {{ l[1:] }} {{ l[:-1] }} "
        "{{ l[5:] }}",
        "{\"s\": \"héllo\", \"l\": [1, 2, 3, 4]}",
        "él olléh lo [1, 3] [4, 3, 2, 1] [2, 3, 4] [1, 2, 3] []");
}

Test(jinja_expr, reverse_messages)
{
    expect_render("{% for m in messages[::-1] %}{{ m.role }} {% endfor %}",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
        "\"Hi\"}]}",
        "user system ");
}

Test(jinja_expr, indexing)
{
    expect_render("{{ l[0] }} {{ l[-1] }} {{ s[0] }} {{ d['a'] }} {{ d.a }} {{ l.1 }}",
        "{\"l\": [1, 2, 3], \"s\": \"xyz\", \"d\": {\"a\": \"A\"}}",
        "1 3 x A A 2");
}

Test(jinja_expr, operator_precedence)
{
    expect_render("{{ 'a' ~ 2 * 3 }} {{ not 1 == 2 }} {{ -2 ** 2 }} {{ 2 * 3 ~ 4 }}",
        "{}",
        "a6 True 4 64");
}

Test(jinja_expr, dict_and_list_literals)
{
    expect_render("{% set d = {'a': [1, 2], 'b': {'c': 'd'}} %}{{ d.a[1] }}{{ d['b'].c }}{{ d|length }}",
        "{}",
        "2d2");
}

Test(jinja_tests, type_tests)
{
    expect_render("{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ n is none }}{{ 's' is string }}{{ "
        "d is mapping }}{{ l is iterable }}{{ 's' is iterable }}{{ l is sequence }}{{ 1 is number }}{{ "
        "1 is integer }}{{ 1.5 is float }}{{ true is boolean }}{{ true is true }}{{ 0 is false }}",
        "{\"x\": 1, \"n\": null, \"d\": {}, \"l\": []}",
        "TrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalse");
}

Test(jinja_tests, value_tests)
{
    expect_render("{{ 3 is odd }}{{ 3 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ 2 is in [1,"
        "2] }}{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ 1 is lt 2 }}{{ 2 is gt 1 }}{{ 2 is ge 2 }}{{ 1 is le "
        "0 }}{{ x is not none }}",
        "{\"x\": 1}",
        "TrueFalseTrueFalseTrueTrueTrueTrueTrueTrueFalseTrue");
}

Test(jinja_tests, is_not_and_string_content)
{
    expect_render("{% for m in msgs %}{{ m.content is string }}{{ m.content is not string }};{% endfor %}",
        "{\"msgs\": [{\"content\": \"a\"}, {\"content\": [{\"type\": \"text\"}]}]}",
        "TrueFalse;FalseTrue;");
}

Test(jinja_set, set_and_block_set)
{
    expect_render("{% set a = 1 %}{% set b, c = 2, 3 %}{% set blk %}x{{ a }}{% endset %}{{ a }}{{ b }}{{ c }}[{{ "
        "blk }}]",
        "{}",
        "123[x1]");
}

Test(jinja_set, namespace_attributes)
{
    expect_render("{% set ns = namespace(found=false, items=[]) %}{% for x in [1,2] %}{% set ns.found = true %}{% "
        "endfor %}{{ ns.found }}",
        "{}",
        "True");
}

Test(jinja_macro, macro_with_defaults)
{
    expect_render("{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('A') "
        "}} {{ greet('B', 'Hi') }} {{ greet(greeting='Yo', name='C') }}",
        "{}",
        "Hello, A! Hi, B! Yo, C!");
}

Test(jinja_macro, call_block_with_caller)
{
    expect_render("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inside{% "
        "endcall %}",
        "{}",
        "<b>inside</b>");
}

Test(jinja_macro, macro_sees_template_variables)
{
    expect_render("{% set sep = '|' %}{% macro j(a, b) %}{{ a }}{{ sep }}{{ b }}{% endmacro %}{{ j(1, 2) }}",
        "{}",
        "1|2");
}

Test(jinja_macro, recursive_macro)
{
    expect_render("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}{% endmacro "
        "%}{{ fact(4) }}",
        "{}",
        "4*3*2*1");
}

Test(jinja_filter, filter_block)
{
    expect_render("{% filter upper %}hello {{ 'x' }}{% endfilter %}",
        "{}",
        "HELLO X");
}

Test(jinja_filter, string_filters)
{
    expect_render("{{ '  a b  '|trim }}|{{ 'ab'|upper }}|{{ 'AB'|lower }}|{{ 'hello wORLD-x'|title }}|{{ 'hELLO'|capitalize "
        "}}|{{ 'xay'|replace('a', 'bb') }}|{{ 'a b c'|wordcount }}",
        "{}",
        "a b|AB|ab|Hello World-X|Hello|xbby|3");
}

Test(jinja_filter, length_first_last_join)
{
    expect_render("{{ l|length }}{{ 'héllo'|length }}{{ d|length }} {{ l|first }}{{ l|last }} {{ l|join(', ') "
        "}} {{ 'abc'|first }} {{ l|join }}",
        "{\"l\": [1, 2, 3], \"d\": {\"a\": 1}}",
        "351 13 1, 2, 3 a 123");
}

Test(jinja_filter, default_filter)
{
    expect_render("{{ x|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ none|d('n', boolean=true) "
        "}} {{ y|d('y') }}",
        "{\"y\": 0}",
        "d  d n 0");
}

Test(jinja_filter, items_list_map)
{
    expect_render("{{ d|items|list }} {{ 'ab'|list }} {{ users|map(attribute='name')|join(',') }} {{ ['a','b']|map('upper')|list "
        "}}",
        "{\"d\": {\"k\": 1}, \"users\": [{\"name\": \"x\"}, {\"name\": \"y\"}]}",
        "[('k', 1)] ['a', 'b'] x,y ['A', 'B']");
}

Test(jinja_filter, select_reject_attr)
{
    expect_render("{{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3,4]|reject('odd')|list }} {{ [0,1,'',2]|select|list "
        "}} {{ ms|selectattr('role', 'equalto', 'user')|map(attribute='c')|list }} {{ ms|rejectattr('role',"
        " 'eq', 'user')|list|length }} {{ ms|selectattr('x')|list|length }}",
        "{\"ms\": [{\"role\": \"user\", \"c\": 1}, {\"role\": \"bot\", \"c\": 2, \"x\": true}]}",
        "[1, 3] [2, 4] [1, 2] [1] 1 1");
}

Test(jinja_filter, unique_sort_reverse)
{
    expect_render("{{ [3,1,2,1]|unique|list }} {{ [3,1,2]|sort }} {{ [3,1,2]|sort(reverse=true) }} {{ ['b','A',"
        "'c']|sort }} {{ [1,2,3]|reverse|list }} {{ 'abc'|reverse }} {{ ms|sort(attribute='n')|map(attribute='n')|list "
        "}}",
        "{\"ms\": [{\"n\": 2}, {\"n\": 1}]}",
        "[3, 1, 2] [1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] [3, 2, 1] cba [1, 2]");
}

Test(jinja_filter, numeric_filters)
{
    expect_render("{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '2.5'|float "
        "}} {{ 3|float }} {{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 2.4|round(0, 'ceil') "
        "}} {{ 7|round }} {{ 1|string ~ 'x' }}",
        "{}",
        "42 4 0 7 3 2.5 3.0 3 2.57 2.0 3.0 7 1x");
}

Test(jinja_filter, dictsort)
{
    expect_render("{{ d|dictsort }} {% for k, v in d|dictsort %}{{ k }}{{ v }}{% endfor %}",
        "{\"d\": {\"b\": 1, \"a\": 2}}",
        "[('a', 2), ('b', 1)] a2b1");
}

Test(jinja_filter, indent)
{
    expect_render("[{{ 'a\n"
        "b\n"
        "\n"
        "c'|indent(2) }}] [{{ 'a\n"
        "b'|indent(2, true) }}] [{{ 'a\n"
        "\n"
        "b'|indent(width=1, blank=true) }}] [{{ 'a\n"
        "'|indent }}]",
        "{}",
        "[a\n"
        "  b\n"
        "\n"
        "  c] [  a\n"
        "  b] [a\n"
        " \n"
        " b] [a\n"
        "]");
}

Test(jinja_filter, tojson_hf_format)
{
    expect_render("{{ d|tojson }} {{ 'é\"\n"
        "'|tojson }} {{ [1, 2.0, none, true]|tojson }} {{ {}|tojson }}",
        "{\"d\": {\"name\": \"f\", \"n\": 1, \"nested\": {\"a\": [1, \"x\"]}}}",
        "{\"name\": \"f\", \"n\": 1, \"nested\": {\"a\": [1, \"x\"]}} \"é\\\"\\n\" [1, 2.0, null, true] "
        "{}");
}

Test(jinja_filter, tojson_indent)
{
    expect_render("{{ d|tojson(indent=2) }}|{{ [1,[2]]|tojson(4) }}",
        "{\"d\": {\"a\": 1, \"b\": [], \"c\": {\"d\": null}}}",
        "{\n"
        "  \"a\": 1,\n"
        "  \"b\": [],\n"
        "  \"c\": {\n"
        "    \"d\": null\n"
        "  }\n"
        "}|[1, [2]]");
}

Test(jinja_filter, safe_and_escape)
{
    expect_render("{{ '<b>'|safe }} {{ '<a href=\"x\">&'|e }}",
        "{}",
        "<b> &lt;a href=&#34;x&#34;&gt;&amp;");
}

Test(jinja_filter, min_max_sum)
{
    expect_render("{{ [3,1,2]|max }} {{ [3,1,2]|min }} {{ [1,2,3]|sum }} {{ [1.5,2]|sum }}",
        "{}",
        "3 1 6 3.5");
}

Test(jinja_method, string_methods)
{
    expect_render("{{ '  x '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}|{{ "
        "'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'abc'.startswith('ab') "
        "}}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'ab'.upper() }}{{ 'AB'.lower() "
        "}}|{{ 'hello world'.title() }}|{{ 'hI'.capitalize() }}",
        "{}",
        "x|a|x|x|['a', 'b', '', 'c']|['a', 'b']|['a', 'b,c']|TrueTrue|bXb|ABab|Hello World|Hi");
}

Test(jinja_method, format_find_count)
{
    expect_render("{{ '{} and {}'.format('a', 1) }}|{{ '{1}{0}'.format('a', 'b') }}|{{ '{x}!'.format(x=5) }}|{{ "
        "'hello'.find('l') }}{{ 'hello'.find('z') }}|{{ 'banana'.count('an') }}",
        "{}",
        "a and 1|ba|5!|2-1|2");
}

Test(jinja_method, dict_methods)
{
    expect_render("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }} {{ d.keys()|list }} {{ d.values()|list "
        "}} {{ d.items()|list }}",
        "{\"d\": {\"a\": 1, \"b\": 2}}",
        "1 None dflt ['a', 'b'] [1, 2] [('a', 1), ('b', 2)]");
}

Test(jinja_method, split_think_blocks)
{
    expect_render("{% set c = '<think>\n"
        "reason\n"
        "</think>\n"
        "\n"
        "answer' %}{{ c.split('</think>')[-1].lstrip('\n"
        "') }}|{{ c.split('</think>')[0].rstrip('\n"
        "').split('<think>')[-1].lstrip('\n"
        "') }}",
        "{}",
        "answer|reason");
}

Test(jinja_global, range_and_dict)
{
    expect_render("{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(3, 0, -1)|list }} {{ dict(a=1, b='x') "
        "}}",
        "{}",
        "[0, 1, 2] [1, 3, 5] [3, 2, 1] {'a': 1, 'b': 'x'}");
}

Test(jinja_global, context_types_roundtrip)
{
    expect_render("{{ i }} {{ f }} {{ b }} {{ n }} {{ s }} {{ l }} {{ o }}",
        "{\"i\": 5, \"f\": 2.5, \"b\": true, \"n\": null, \"s\": \"str\", \"l\": [1, \"2\"], \"o\": "
        "{\"x\": [true, null, 1.0]}}",
        "5 2.5 True None str [1, '2'] {'x': [True, None, 1.0]}");
}

Test(jinja_global, context_key_order_preserved)
{
    expect_render("{{ o|tojson }} {% for k in o %}{{ k }}{% endfor %}",
        "{\"o\": {\"zeta\": 1, \"alpha\": 2, \"mid\": 3}}",
        "{\"zeta\": 1, \"alpha\": 2, \"mid\": 3} zetaalphamid");
}

Test(jinja_macro, call_block_with_caller_args)
{
    expect_render("{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) "
        "each([1, 2]) %}<{{ x }}>{% endcall %}",
        "{}",
        "<1><2>");
}

Test(jinja_macro, macro_varargs_kwargs)
{
    expect_render("{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k='v') }}",
        "{}",
        "1(2, 3){'k': 'v'}");
}

Test(jinja_ws, nested_blocks_chat_style)
{
    expect_render("{% for m in messages %}\n"
        "    {% if m.role == 'system' %}\n"
        "        {{- '<<' + m.content + '>>\\n' }}\n"
        "    {% else %}\n"
        "        {{- m.role + ': ' + m.content + '\\n' }}\n"
        "    {% endif %}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}\n"
        "    {{- 'assistant:' }}\n"
        "{% endif %}\n",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
        "\"Hi\"}], \"add_generation_prompt\": true}",
        "<<Be brief.>>\n"
        "\n"
        "user: Hi\n"
        "\n"
        "assistant:\n");
}

Test(jinja_ws, raw_with_whitespace_control)
{
    expect_render("a\n"
        "{%- raw -%}\n"
        " {{ x }} \n"
        "{%- endraw %}\n"
        "b",
        "{}",
        "a{{ x }}b");
}

Test(jinja_expr, string_escapes)
{
    expect_render("{{ 'a\\tb\\\\n' }}|{{ \"it's\" }}|{{ 'x' 'y' }}|{{ '\\u00e9' }}",
        "{}",
        "a\tb\\n|it's|xy|é");
}

Test(jinja_expr, nested_attribute_and_call_chain)
{
    expect_render("{{ messages[0]['content'].upper().split(' ')|join('_') }}",
        "{\"messages\": [{\"content\": \"a b c\"}]}",
        "A_B_C");
}

Test(jinja_expr, filter_then_test)
{
    expect_render("{{ [1,2]|length is even }} {{ 'abc'|upper is string }}",
        "{}",
        "True True");
}

Test(jinja_expr, unary_minus_with_filter)
{
    expect_render("{{ -3|abs }} {{ -(3)|abs }} {{ (-3)|abs }}",
        "{}",
        "3 3 3");
}

Test(jinja_tests, defined_on_missing_keys)
{
    expect_render("{% for m in ms %}{{ m.tool_calls is defined }}{{ m.tool_calls is defined and m.tool_calls }};{% "
        "endfor %}",
        "{\"ms\": [{\"role\": \"a\"}, {\"role\": \"b\", \"tool_calls\": [1]}]}",
        "FalseFalse;True[1];");
}

Test(jinja_filter, tojson_of_tools_like_qwen)
{
    expect_render("{% for tool in tools %}\n"
        "{{ tool | tojson }}\n"
        "{% endfor %}",
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
        "\"Weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
        "\"string\"}}, \"required\": [\"city\"]}}}]}",
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather "
        "in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}},"
        " \"required\": [\"city\"]}}}\n");
}

Test(jinja_filter, map_with_filter_args)
{
    expect_render("{{ ['a-b','c-d']|map('replace', '-', '+')|join(' ') }} {{ [1.55, 2.45]|map('round', 1)|list "
        "}}",
        "{}",
        "a+b c+d [1.6, 2.5]");
}

Test(jinja_filter, join_attribute)
{
    expect_render("{{ us|join(', ', attribute='n') }}",
        "{\"us\": [{\"n\": \"a\"}, {\"n\": \"b\"}]}",
        "a, b");
}

Test(jinja_loop, loop_over_tuple_of_dicts_items)
{
    expect_render("{% for name, spec in props|items %}{{ name }}:{{ spec.type }} {% endfor %}",
        "{\"props\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}}",
        "city:string days:integer ");
}

Test(jinja_loop, loop_last_separator)
{
    expect_render("{% for x in l %}{{ x }}{% if not loop.last %}, {% endif %}{% endfor %}",
        "{\"l\": [\"a\", \"b\", \"c\"]}",
        "a, b, c");
}

Test(jinja_set, set_in_if_is_visible_after)
{
    expect_render("{% if true %}{% set x = 'in' %}{% endif %}{{ x }}",
        "{}",
        "in");
}

Test(jinja_set, set_in_for_does_not_leak)
{
    expect_render("{% set x = 'out' %}{% for i in [1] %}{% set x = 'in' %}{{ x }}{% endfor %}{{ x }}",
        "{}",
        "inout");
}

Test(jinja_expr, big_and_negative_numbers)
{
    expect_render("{{ 9007199254740993 }} {{ -5 }} {{ 10 ** 18 }} {{ 1.5e300 * 10 }} {{ -0.0 }} {{ 3 // -2 }} "
        "{{ 2 ** -1 }}",
        "{}",
        "9007199254740993 -5 1000000000000000000 1.5e+301 -0.0 -2 0.5");
}

Test(jinja_ws, crlf_newlines_are_normalized)
{
    expect_render("{% if true %}\r\n"
        "x\r\n"
        "{% endif %}\r\n"
        "y\rz\r\n",
        "{}",
        "x\n"
        "y\n"
        "z");
}

Test(jinja_ws, leading_indent_at_template_start_is_lstripped)
{
    expect_render("  {% if true %}a{% endif %}\n"
        "\t{% if true %}b{% endif %}",
        "{}",
        "ab");
}

Test(jinja_ws, block_after_output_on_same_line_keeps_space)
{
    expect_render("{{ 'a' }}  {% if true %}b{% endif %}",
        "{}",
        "a  b");
}

Test(jinja_ws, comment_minus_markers)
{
    expect_render("a  {#- c -#}  b\n"
        "  {#- c #}\n"
        "c",
        "{}",
        "abc");
}

Test(jinja_ws, minus_end_before_output)
{
    expect_render("{% for x in [1,2] -%}\n"
        "   {{ x }}\n"
        "{%- endfor %}",
        "{}",
        "12");
}

Test(jinja_ws, tabs_and_spaces_lstripped)
{
    expect_render("x\n"
        " \t {% if true %}\n"
        " \t y\n"
        " \t {% endif %}\n",
        "{}",
        "x\n"
        " \t y\n");
}

Test(jinja_ws, trim_after_endfor_at_end)
{
    expect_render("{% for x in 'ab' %}\n"
        "{{ x }}\n"
        "{% endfor %}\n",
        "{}",
        "a\n"
        "b\n");
}

Test(jinja_ws, minus_on_raw)
{
    expect_render("a  {%- raw %} r {% endraw -%}  b",
        "{}",
        "a r b");
}

Test(jinja_filter, filters_on_undefined)
{
    expect_render("[{{ u|length }}][{{ u|string }}][{{ u|list }}][{{ u|items|list }}][{{ u|trim }}][{{ u|join(',"
        "') }}]",
        "{}",
        "[0][][[]][[]][][]");
}

Test(jinja_filter, trim_with_chars_and_strip_methods_with_unicode)
{
    expect_render("{{ '--a--'|trim('-') }} {{ ' é '.strip() }} {{ 'ÉCOLE'|lower }} {{ 'straße'|upper }}",
        "{}",
        "a é école STRASSE");
}

Test(jinja_tests, sameas_and_none_comparisons)
{
    expect_render("{{ none is sameas none }} {{ false is sameas false }} {{ x is none }} {{ x == none }}",
        "{\"x\": null}",
        "True True True True");
}

Test(jinja_expr, string_comparison_and_sorting)
{
    expect_render("{{ 'a' < 'b' }} {{ 'B' < 'a' }} {{ [1, 2] < [1, 3] }} {{ ['b', 'a', 'C']|sort(case_sensitive=true) "
        "}}",
        "{}",
        "True True True ['C', 'a', 'b']");
}

Test(jinja_expr, in_with_keys_from_context)
{
    expect_render("{% for m in ms %}{{ 'content' in m }}{{ 'reasoning_content' in m }} {% endfor %}",
        "{\"ms\": [{\"content\": \"x\"}, {\"reasoning_content\": \"r\"}]}",
        "TrueFalse FalseTrue ");
}

Test(jinja_loop, loop_length_with_filter_and_else)
{
    expect_render("{% for x in [1,2,3,4] if x > 2 %}{{ loop.length }}{{ loop.last }} {% else %}none{% endfor %}{% "
        "for x in [1] if x > 2 %}{% else %}none{% endfor %}",
        "{}",
        "2False 2True none");
}

Test(jinja_macro, macro_output_is_a_string_value)
{
    expect_render("{% macro m() %} x {% endmacro %}[{{ m()|trim }}][{{ m()|length }}]",
        "{}",
        "[x][3]");
}

Test(jinja_expr, ternary_chains)
{
    expect_render("{{ 'a' if x == 1 else 'b' if x == 2 else 'c' }}",
        "{\"x\": 2}",
        "b");
}

Test(jinja_expr, nested_data_printing)
{
    expect_render("{{ d }} {{ l }} {{ \"it's\" }} {{ [\"it's\", 'q\"'] }}",
        "{\"d\": {\"a\": {\"b\": [1, null]}, \"c\": \"x\\ny\"}, \"l\": [[], {}]}",
        "{'a': {'b': [1, None]}, 'c': 'x\\ny'} [[], {}] it's [\"it's\", 'q\"']");
}

Test(jinja_method, unicode_whitespace_strip_and_split)
{
    expect_render("[{{ '  x　\n"
        "'|trim }}] {{ 'a b c  d'.split() }} [{{ 'éxé'.strip('é') }}] [{{ 'èxè'.strip('é') }}] {{ 'a "
        "b  c'.split(none, 1) }}",
        "{}",
        "[x] ['a', 'b', 'c', 'd'] [x] [èxè] ['a', 'b  c']");
}

Test(jinja_expr, python_float_semantics)
{
    expect_render("{{ 1.5 // 0.1 }} {{ -7.5 // 2 }} {{ 7.5 % -2 }} {{ 0 % -1.0 }} {{ 1.5 is odd }} {{ 3.0 is odd "
        "}} {{ 4.0 is even }} {{ 0.5 is divisibleby 0.25 }} {{ (1, 2) * 2 }}",
        "{}",
        "14.0 -4.0 -0.5 -0.0 False True True True (1, 2, 1, 2)");
}

Test(jinja_filter, map_and_select_skip_falsy_input)
{
    expect_render("{{ false|map('string')|list }} {{ 0|select|list }} {{ ''|reject|list }}",
        "{}",
        "[] [] []");
}

Test(jinja_tests, undefined_counts_as_iterable_sequence)
{
    expect_render("{{ u is iterable }} {{ u is sequence }} {{ ''|last is sequence }}",
        "{}",
        "True True True");
}

Test(jinja_filter, tojson_options_like_json_dumps)
{
    expect_render("{{ d|tojson(sort_keys=true) }} {{ d|tojson(separators=(',', ':')) }} {{ d|tojson(ensure_ascii=true) "
        "}} {{ d|tojson(indent=1, sort_keys=true) }} {{ d|tojson(ensure_ascii=false) }}",
        "{\"z\": 1, \"d\": {\"b\": [1, {\"y\": 2, \"x\": \"é😀\"}], \"a\": null}}",
        "{\"a\": null, \"b\": [1, {\"x\": \"é😀\", \"y\": 2}]} {\"b\":[1,{\"y\":2,\"x\":\"é😀\"}],\"a\":null} "
        "{\"b\": [1, {\"y\": 2, \"x\": \"\\u00e9\\ud83d\\ude00\"}], \"a\": null} {\n"
        " \"a\": null,\n"
        " \"b\": [\n"
        "  1,\n"
        "  {\n"
        "   \"x\": \"é😀\",\n"
        "   \"y\": 2\n"
        "  }\n"
        " ]\n"
        "} {\"b\": [1, {\"y\": 2, \"x\": \"é😀\"}], \"a\": null}");
}

Test(jinja_ws, raw_begin_is_not_trimmed_but_endraw_is_lstripped)
{
    expect_render("\n"
        "\n"
        "{%+ raw %}\n"
        "{{ x }}\n"
        "  {% endraw %}\t{{ 'v' }}x\n"
        " {{- 'v' }} ",
        "{}",
        "\n"
        "\n"
        "\n"
        "{{ x }}\n"
        "\tvxv ");
}

Test(jinja_ws, raw_inside_loop_with_markers)
{
    expect_render("x\n"
        " {%+ for i in [1,2] -%}{% raw -%} {{ x }}x\n"
        " {% endraw -%}\n"
        "  {%+ endfor %}\n"
        "  ",
        "{}",
        "x\n"
        " {{ x }}x\n"
        "{{ x }}x\n"
        "  ");
}

Test(jinja_ws, plus_on_block_end_keeps_newline)
{
    expect_render("{% if true +%}\n"
        "a\n"
        "{%+ endif +%}\n"
        "b",
        "{}",
        "\n"
        "a\n"
        "\n"
        "b");
}


/* ---- real chat templates (files from scripts/fetch-tokenizers.sh; skipped without them) ---- */

Test(jinja_real_qwen3, system_and_user)
{
    expect_real_template("qwen3",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"You are helpful.\"}, {\"role\": \"user\","
        " \"content\": \"Hello, how are you\?\"}], \"add_generation_prompt\": true, \"bos_token\": null,"
        " \"eos_token\": \"<|im_end|>\"}",
        "<|im_start|>system\n"
        "You are helpful.<|im_end|>\n"
        "<|im_start|>user\n"
        "Hello, how are you\?<|im_end|>\n"
        "<|im_start|>assistant\n");
}

Test(jinja_real_qwen3, multi_turn_drops_old_reasoning)
{
    expect_real_template("qwen3",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": "
        "\"<think>\\nThe user greets.\\n</think>\\n\\nHello!\"}, {\"role\": \"user\", \"content\": \"What "
        "is 2+2\?\"}], \"add_generation_prompt\": true, \"bos_token\": null, \"eos_token\": \"<|im_end|>\"}",
        "<|im_start|>user\n"
        "Hi<|im_end|>\n"
        "<|im_start|>assistant\n"
        "Hello!<|im_end|>\n"
        "<|im_start|>user\n"
        "What is 2+2\?<|im_end|>\n"
        "<|im_start|>assistant\n");
}

Test(jinja_real_qwen3, tools_tool_calls_and_results)
{
    expect_real_template("qwen3",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be precise.\"}, {\"role\": \"user\", "
        "\"content\": \"Weather in Paris\?\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": "
        "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": "
        "\"Paris\"}}}]}, {\"role\": \"tool\", \"content\": \"{\\\"temp\\\": 21}\"}, {\"role\": \"tool\","
        " \"content\": \"sunny\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
        " \"description\": \"Get the weather\", \"parameters\": {\"type\": \"object\", \"properties\": "
        "{\"city\": {\"type\": \"string\", \"description\": \"City name\"}}, \"required\": [\"city\"]}}}],"
        " \"add_generation_prompt\": true, \"bos_token\": null, \"eos_token\": \"<|im_end|>\"}",
        "<|im_start|>system\n"
        "Be precise.\n"
        "\n"
        "# Tools\n"
        "\n"
        "You may call one or more functions to assist with the user query.\n"
        "\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n"
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the "
        "weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\","
        " \"description\": \"City name\"}}, \"required\": [\"city\"]}}}\n"
        "</tools>\n"
        "\n"
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
        "XML tags:\n"
        "<tool_call>\n"
        "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "Weather in Paris\?<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<tool_call>\n"
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        "<tool_response>\n"
        "{\"temp\": 21}\n"
        "</tool_response>\n"
        "<tool_response>\n"
        "sunny\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n");
}

Test(jinja_real_qwen3, enable_thinking_false)
{
    expect_real_template("qwen3",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"add_generation_prompt\": true,"
        " \"enable_thinking\": false, \"bos_token\": null, \"eos_token\": \"<|im_end|>\"}",
        "<|im_start|>user\n"
        "Hi<|im_end|>\n"
        "<|im_start|>assistant\n"
        "<think>\n"
        "\n"
        "</think>\n"
        "\n");
}

Test(jinja_real_llama3, system_and_user)
{
    expect_real_template("llama3",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"You are helpful.\"}, {\"role\": \"user\","
        " \"content\": \"Hello, how are you\?\"}], \"add_generation_prompt\": true, \"bos_token\": \"<|begin_of_text|>\","
        " \"eos_token\": \"<|end_of_text|>\"}",
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n"
        "\n"
        "You are helpful.<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
        "\n"
        "Hello, how are you\?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
        "\n");
}

Test(jinja_real_llama3, multi_turn)
{
    expect_real_template("llama3",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"  Hi  \"}, {\"role\": \"assistant\", \"content\": "
        "\"Hello!\"}, {\"role\": \"user\", \"content\": \"Bye\"}], \"add_generation_prompt\": true, "
        "\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|end_of_text|>\"}",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n"
        "\n"
        "Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
        "\n"
        "Hello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
        "\n"
        "Bye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
        "\n");
}

Test(jinja_real_gemma3, system_and_user)
{
    expect_real_template("gemma3",
        "{\"messages\": [{\"role\": \"system\", \"content\": \"You are helpful.\"}, {\"role\": \"user\","
        " \"content\": \"Hello, how are you\?\"}], \"add_generation_prompt\": true, \"bos_token\": \"<bos>\","
        " \"eos_token\": \"<end_of_turn>\"}",
        "<bos><start_of_turn>user\n"
        "You are helpful.\n"
        "\n"
        "Hello, how are you\?<end_of_turn>\n"
        "<start_of_turn>model\n");
}

Test(jinja_real_gemma3, multi_turn_with_content_parts)
{
    expect_real_template("gemma3",
        "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Look\"},"
        " {\"type\": \"image\"}]}, {\"role\": \"assistant\", \"content\": \"Nice.\"}, {\"role\": \"user\","
        " \"content\": \"Thanks\"}], \"add_generation_prompt\": false, \"bos_token\": \"<bos>\", \"eos_token\": "
        "\"<end_of_turn>\"}",
        "<bos><start_of_turn>user\n"
        "Look<start_of_image><end_of_turn>\n"
        "<start_of_turn>model\n"
        "Nice.<end_of_turn>\n"
        "<start_of_turn>user\n"
        "Thanks<end_of_turn>\n");
}
