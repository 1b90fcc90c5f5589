/* tests/unit/test_turns.c — the device's turns (engine/turns.h): a ticket lock that hands slices
 * out in the order they were asked for, and a chat engine and a transcriber sharing them, each
 * making progress while the other has a long job running (counts, never timings). */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/transcribe.h"
#include "engine/turns.h"
#include "model/model.h"
#include "test_support.h"
#include "text/tokenizer.h"
#include "tools/mkwhisper.h"

/* ---- the lock alone ------------------------------------------------------------------------ */

struct taker {
    struct device_turns *turns;
    enum device_side side;
    int slices;
    int *log, *n_log; /* shared: who ran each slice, in order (written inside the turn) */
};

static void *take_slices(void *arg)
{
    struct taker *k = arg;
    for (int i = 0; i < k->slices; i++) {
        device_turns_take(k->turns, k->side);
        k->log[(*k->n_log)++] = k->side;
        device_turns_give(k->turns);
    }
    return NULL;
}

Test(turns, two_takers_both_finish_and_every_slice_is_counted)
{
    struct device_turns *t;
    struct err err = {0};
    cr_assert_eq(device_turns_create(&t, &err), 0);
    int log[400], n_log = 0;
    struct taker a = {t, DEVICE_TURNS_ENGINE, 200, log, &n_log},
                 b = {t, DEVICE_TURNS_TRANSCRIBER, 200, log, &n_log};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, take_slices, &a);
    pthread_create(&tb, NULL, take_slices, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    cr_assert_eq(n_log, 400, "slices run one at a time: %d logged", n_log);
    cr_assert_eq(device_turns_count(t, DEVICE_TURNS_ENGINE), 200);
    cr_assert_eq(device_turns_count(t, DEVICE_TURNS_TRANSCRIBER), 200);
    device_turns_take(NULL, DEVICE_TURNS_ENGINE); /* no sharing: nothing to wait for */
    device_turns_give(NULL);
    device_turns_free(t);
}

/* ---- a chat engine and a transcriber on one device ------------------------------------------ */

struct shared {
    char *chat_dir, *whisper_dir;
    struct backend *chat_be, *whisper_be;
    struct model *model;
    struct tokenizer *tok;
    struct engine *engine;
    struct transcriber *t;
    struct device_turns *turns;
};

static struct shared sh;

/* tiny-qwen3 (the real Qwen3 tokenizer, INFERD_TOKENIZER_DATA) in an engine, whisper-test in a
 * transcriber, each on a backend of its own, both taking the same turns. */
static void share_setup(void)
{
    const char *data = getenv("INFERD_TOKENIZER_DATA");
    if (!data)
        cr_skip_test("INFERD_TOKENIZER_DATA is not set; run scripts/fetch-tokenizers.sh DIR and "
                     "export it");
    struct err err = {0};
    sh.chat_dir = test_mkdtemp();
    sh.whisper_dir = test_mkdtemp();
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s mkmodel --preset tiny-qwen3 --seed 3 --tokenizer %s/qwen3 --out %s >/dev/null",
             INFERD_BINARY, data, sh.chat_dir);
    cr_assert_eq(system(cmd), 0, "mkmodel failed: %s", cmd);
    cr_assert_eq(device_turns_create(&sh.turns, &err), 0);
    struct backend_options bo = {.threads = 1};
    cr_assert_eq(backend_cpu_create(&bo, &sh.chat_be, &err), 0, "%s", err.msg);
    cr_assert_eq(backend_cpu_create(&bo, &sh.whisper_be, &err), 0, "%s", err.msg);
    cr_assert_eq(model_load(sh.chat_dir, sh.chat_be, &sh.model, &err), 0, "%s", err.msg);
    cr_assert_eq(tok_load(sh.chat_dir, &sh.tok, &err), 0, "%s", err.msg);
    struct engine_config cfg = {.n_ctx = 512, .max_seqs = 2, .max_step_tokens = 64,
                                .max_queue = 8, .turns = sh.turns};
    cr_assert_eq(engine_create(sh.model, sh.tok, &cfg, &sh.engine, &err), 0, "%s", err.msg);
    cr_assert_eq(mkwhisper_write("whisper-test", 1, sh.whisper_dir, &err), 0, "%s", err.msg);
    cr_assert_eq(transcriber_create(sh.whisper_dir, sh.whisper_be, &sh.t, &err), 0, "%s",
                 err.msg);
    transcriber_set_turns(sh.t, sh.turns);
    cr_assert_eq(transcriber_load(sh.t, &err), 0, "%s", err.msg);
}

static void share_teardown(void)
{
    engine_free(sh.engine);
    transcriber_free(sh.t);
    tok_free(sh.tok);
    model_free(sh.model);
    backend_destroy(sh.chat_be);
    backend_destroy(sh.whisper_be);
    device_turns_free(sh.turns);
    if (sh.chat_dir)
        test_rmtree(sh.chat_dir);
    if (sh.whisper_dir)
        test_rmtree(sh.whisper_dir);
    free(sh.chat_dir);
    free(sh.whisper_dir);
    memset(&sh, 0, sizeof sh);
}

TestSuite(shared_device, .init = share_setup, .fini = share_teardown, .timeout = 300);

struct job {
    size_t n;                  /* samples */
    int max_new_tokens;
    atomic_bool running, done;
    int rc;
    int windows;               /* windows finished (on_progress) */
};

static int count_window(void *ctx, double done, double total)
{
    (void)done, (void)total;
    ((struct job *)ctx)->windows++;
    return 0;
}

static void *transcribe_job(void *arg)
{
    struct job *j = arg;
    float *x = malloc(j->n * sizeof *x);
    for (size_t i = 0; i < j->n; i++)
        x[i] = 0.3f * sinf(2 * (float)M_PI * (220.0f + (float)(i / 8000 % 7) * 60.0f) * i / 16000);
    struct transcribe_options o = {.language = "en", .temperature = 0.3f, .seed = 7,
                                   .max_new_tokens = j->max_new_tokens, .no_previous_text = true,
                                   .on_progress = count_window, .ctx = j};
    struct transcribe_result r;
    struct err err = {0};
    atomic_store(&j->running, true);
    j->rc = transcriber_run(sh.t, x, j->n, &o, &r, &err);
    atomic_store(&j->running, false);
    atomic_store(&j->done, true);
    if (j->rc == 0)
        transcribe_result_free(&r);
    free(x);
    return NULL;
}

static struct gen_output *submit_chat(int max_tokens)
{
    int32_t prompt[8] = {785, 3974, 13876, 38835, 34208, 916, 279, 15678};
    struct gen_params p = {.prompt = prompt, .n_prompt = 8, .max_tokens = max_tokens,
                           .sampling = {.temperature = 0, .top_p = 1}, .logprobs = -1};
    struct gen_output *o;
    struct err err = {0};
    cr_assert_eq(engine_submit(sh.engine, &p, &o, &err), 0, "%s", err.msg);
    return o;
}

/* A long transcription (ten 30 s windows) is under way when a chat request comes: the chat's
 * tokens stream while the transcription is still running, and the transcription goes on. */
Test(shared_device, a_long_transcription_does_not_stall_a_chat_stream)
{
    struct job j = {.n = (size_t)16000 * 300};
    pthread_t th;
    pthread_create(&th, NULL, transcribe_job, &j);
    while (device_turns_count(sh.turns, DEVICE_TURNS_TRANSCRIBER) == 0 && !atomic_load(&j.done))
        sched_yield();
    cr_assert(!atomic_load(&j.done), "the transcription ended before its first slice was seen");
    uint64_t whisper_before = device_turns_count(sh.turns, DEVICE_TURNS_TRANSCRIBER);
    struct gen_output *o = submit_chat(24);
    int during = 0; /* chat tokens that arrived while the transcription ran */
    pthread_mutex_lock(&o->mu);
    size_t seen = 0;
    while (o->finish == GEN_RUNNING || seen < o->n_ids) {
        if (o->n_ids > seen) {
            if (atomic_load(&j.running))
                during += (int)(o->n_ids - seen);
            seen = o->n_ids;
            continue;
        }
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
        if (o->n_ids == seen && o->finish == GEN_RUNNING)
            continue;
        if (o->n_ids > seen && atomic_load(&j.running))
            during += (int)(o->n_ids - seen);
        seen = o->n_ids;
    }
    enum gen_finish fin = o->finish;
    pthread_mutex_unlock(&o->mu);
    uint64_t whisper_after = device_turns_count(sh.turns, DEVICE_TURNS_TRANSCRIBER);
    bool still_running = atomic_load(&j.running);
    gen_output_release(o);
    pthread_join(th, NULL);
    cr_assert_eq(j.rc, 0);
    cr_assert_eq(fin, GEN_FINISH_LENGTH);
    cr_assert_eq(seen, 24);
    cr_assert_gt(during, 0, "no chat token arrived while the transcription ran");
    cr_assert(still_running || during == 24,
              "the chat finished only after the transcription (%d of 24 tokens during it)", during);
    cr_assert_gt(whisper_after, whisper_before,
                 "the transcription made no progress while the chat streamed");
    cr_assert_geq(j.windows, 1);
}

/* A long chat generation is streaming when a transcription comes: the transcription finishes
 * while the chat is still generating, and the chat goes on to its end. */
Test(shared_device, a_long_chat_stream_does_not_stall_a_transcription)
{
    struct gen_output *o = submit_chat(400);
    pthread_mutex_lock(&o->mu);
    while (o->n_ids == 0 && o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    pthread_mutex_unlock(&o->mu);
    uint64_t engine_before = device_turns_count(sh.turns, DEVICE_TURNS_ENGINE);
    struct job j = {.n = 16000 * 2, .max_new_tokens = 16};
    transcribe_job(&j);
    uint64_t engine_after = device_turns_count(sh.turns, DEVICE_TURNS_ENGINE);
    pthread_mutex_lock(&o->mu);
    enum gen_finish at_end = o->finish;
    size_t chat_tokens = o->n_ids;
    while (o->finish == GEN_RUNNING)
        gen_output_wait(o, o->text.len, o->n_tokens, 1000);
    size_t total = o->n_ids;
    pthread_mutex_unlock(&o->mu);
    gen_output_release(o);
    cr_assert_eq(j.rc, 0);
    cr_assert_eq(j.windows, 1);
    cr_assert_eq(at_end, GEN_RUNNING,
                 "the transcription ended only after the chat (%zu tokens)", chat_tokens);
    cr_assert_gt(engine_after, engine_before, "the chat made no progress during the transcription");
    cr_assert_eq(total, 400);
}
