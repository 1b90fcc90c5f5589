/* cli/device.c — the `--device cpu|cuda[:N]|auto` flag and the backend flags: parsing them and creating the backend they name. */
#include "cli/device.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/collective.h"
#include "backend/cpu/cpu.h"
#include "backend/cuda/cuda.h"
#include "base/cpu.h"
#include "base/threadpool.h"
#include "cli/args.h"
#include "kv/kv_quant_config.h"
#include "model/config.h"

bool cli_device_parse(const char *text, struct device_spec *out)
{
    *out = (struct device_spec){.kind = DEVICE_CPU, .index = 0};
    if (!strcmp(text, "cpu"))
        return true;
    if (!strcmp(text, "auto")) {
        out->kind = DEVICE_AUTO;
        return true;
    }
    if (!strncmp(text, "cuda", 4) && (text[4] == '\0' || text[4] == ':')) {
        out->kind = DEVICE_CUDA;
        if (text[4] == '\0')
            return true;
        char *end;
        errno = 0;
        long v = strtol(text + 5, &end, 10);
        if (!errno && end != text + 5 && !*end && v >= 0 && v < 1024) {
            out->index = (int)v;
            return true;
        }
    }
    fprintf(stderr, "inferd: --device: '%s' is not cpu, cuda, cuda:N or auto\n", text);
    return false;
}

/* A switch variable: "0" turns its feature off, anything else leaves the default. */
static enum backend_switch env_off(const char *name)
{
    const char *v = getenv(name);
    return v && !strcmp(v, "0") ? BACKEND_OFF : BACKEND_DEFAULT;
}

/* A switch variable of a feature off by default: "1" turns it on. */
static enum backend_switch env_on(const char *name)
{
    const char *v = getenv(name);
    return v && !strcmp(v, "1") ? BACKEND_ON : BACKEND_DEFAULT;
}

void cli_backend_options_from_env(struct backend_options *out)
{
    *out = (struct backend_options){0};
    /* an unknown level caps nothing, as before flags existed */
    const char *isa = getenv("INFERD_CPU");
    if (isa && *isa && !cpu_isa_parse(isa, &out->cpu_isa))
        out->cpu_isa = CPU_ISA_BEST;
    const char *kv = getenv("INFERD_CUDA_KV");
    if (kv && !strcmp(kv, "f32"))
        out->kv_type = BACKEND_KV_F32;
    out->gpu_sampling = env_off("INFERD_CUDA_SAMPLE");
    out->cuda_graphs = env_off("INFERD_CUDA_GRAPHS");
    out->cuda_pdl = env_off("INFERD_CUDA_PDL");
    out->cuda_norm_fusion = env_off("INFERD_CUDA_NORM_FUSION");
    out->cuda_qk_fusion = env_off("INFERD_CUDA_QK_ATTN");
    out->cuda_qk_span_fusion = env_on("INFERD_CUDA_QK_SPAN");
    const char *norm_sums = getenv("INFERD_CUDA_NORM_SUMS");
    if (norm_sums && !strcmp(norm_sums, "1"))
        out->cuda_norm_sums = BACKEND_ON;
    else if (norm_sums && !strcmp(norm_sums, "0"))
        out->cuda_norm_sums = BACKEND_OFF;
    out->cuda_add_norm_fusion = env_off("INFERD_CUDA_ADD_NORM");
    out->cuda_gemm_x_fusion = env_off("INFERD_CUDA_GEMM_X");
    out->cuda_gemm_bf16_swiglu = env_off("INFERD_CUDA_GEMM_BF16_SWIGLU");
    out->cuda_gemm_residual = env_off("INFERD_CUDA_GEMM_RESIDUAL");
    out->cuda_prefill_tc = env_off("INFERD_CUDA_PREFILL_TC");
    out->cuda_qprefill_ws = env_off("INFERD_CUDA_QPREFILL_WS");
    out->cuda_prefill_wgmma = env_off("INFERD_CUDA_PREFILL_WGMMA");
    out->cuda_qprefill_pair = env_off("INFERD_CUDA_QPREFILL_PAIR");
    out->cuda_qprefill_window = env_off("INFERD_CUDA_QPREFILL_WINDOW");
    out->cuda_decode_tc = env_off("INFERD_CUDA_DECODE_TC");
    const char *batch_gemm = getenv("INFERD_CUDA_BATCH_GEMM");
    if (batch_gemm && !strcmp(batch_gemm, "1"))
        out->cuda_batch_gemm = BACKEND_ON;
    const char *wgmma_gemm = getenv("INFERD_CUDA_WGMMA_GEMM");
    if (wgmma_gemm && !strcmp(wgmma_gemm, "1"))
        out->cuda_wgmma_gemm = BACKEND_ON;
    out->cuda_moe = env_off("INFERD_CUDA_MOE");
    const char *lora_rows = getenv("INFERD_CUDA_LORA_ROWS");
    if (lora_rows && !strcmp(lora_rows, "1"))
        out->cuda_lora_rows = BACKEND_ON;
    out->cuda_skinny_gemm = env_off("INFERD_CUDA_SKINNY");
    const char *qgemv = getenv("INFERD_CUDA_QGEMV");
    if (qgemv && (!strcmp(qgemv, "float") || !strcmp(qgemv, "0")))
        out->cuda_qgemv_dp4a = BACKEND_OFF;
    if (qgemv && !strcmp(qgemv, "dp4a"))
        out->cuda_qgemv_stream = BACKEND_OFF;
    if (qgemv && !strcmp(qgemv, "stream"))
        out->cuda_qgemv_mixed = BACKEND_OFF;
    const char *profile = getenv("INFERD_CUDA_PROFILE");
    if (profile && !strcmp(profile, "ops"))
        out->profile = BACKEND_PROFILE_OPS;
    else if (profile && !strcmp(profile, "graphs"))
        out->profile = BACKEND_PROFILE_GRAPHS;
}

int cli_backend_flag(const char *flag, const char *value, struct backend_options *o)
{
    static const struct {
        const char *flag;
        size_t field;
    } switches[] = {
        {"--gpu-sampling", offsetof(struct backend_options, gpu_sampling)},
        {"--cuda-graphs", offsetof(struct backend_options, cuda_graphs)},
        {"--cuda-pdl", offsetof(struct backend_options, cuda_pdl)},
        {"--cuda-norm-fusion", offsetof(struct backend_options, cuda_norm_fusion)},
        {"--cuda-qk-fusion", offsetof(struct backend_options, cuda_qk_fusion)},
        {"--cuda-qk-span-fusion", offsetof(struct backend_options, cuda_qk_span_fusion)},
        {"--cuda-norm-sums", offsetof(struct backend_options, cuda_norm_sums)},
        {"--cuda-add-norm-fusion", offsetof(struct backend_options, cuda_add_norm_fusion)},
        {"--cuda-gemm-x-fusion", offsetof(struct backend_options, cuda_gemm_x_fusion)},
        {"--cuda-gemm-bf16-swiglu", offsetof(struct backend_options, cuda_gemm_bf16_swiglu)},
        {"--cuda-gemm-residual", offsetof(struct backend_options, cuda_gemm_residual)},
        {"--cuda-prefill-tc", offsetof(struct backend_options, cuda_prefill_tc)},
        {"--cuda-qprefill-ws", offsetof(struct backend_options, cuda_qprefill_ws)},
        {"--cuda-prefill-wgmma", offsetof(struct backend_options, cuda_prefill_wgmma)},
        {"--cuda-qprefill-pair", offsetof(struct backend_options, cuda_qprefill_pair)},
        {"--cuda-qprefill-window", offsetof(struct backend_options, cuda_qprefill_window)},
        {"--cuda-decode-tc", offsetof(struct backend_options, cuda_decode_tc)},
        {"--cuda-batch-gemm", offsetof(struct backend_options, cuda_batch_gemm)},
        {"--cuda-wgmma-gemm", offsetof(struct backend_options, cuda_wgmma_gemm)},
        {"--cuda-moe", offsetof(struct backend_options, cuda_moe)},
        {"--cuda-skinny-gemm", offsetof(struct backend_options, cuda_skinny_gemm)},
        {"--cuda-lora-rows", offsetof(struct backend_options, cuda_lora_rows)},
    };
    for (size_t i = 0; i < sizeof switches / sizeof switches[0]; i++) {
        if (strcmp(flag, switches[i].flag))
            continue;
        bool on;
        if (!arg_on_off(flag, value, &on))
            return -1;
        *(enum backend_switch *)((char *)o + switches[i].field) = on ? BACKEND_ON : BACKEND_OFF;
        return 1;
    }
    if (!strcmp(flag, "--cpu-isa")) {
        if (!cpu_isa_parse(value, &o->cpu_isa) || o->cpu_isa == CPU_ISA_SCALAR) {
            fprintf(stderr, "inferd: --cpu-isa: '%s' is not avx2, avx512, avx512bf16 or amx\n",
                    value);
            return -1;
        }
        return 1;
    }
    if (!strcmp(flag, "--kv-dtype")) {
        if (!strcmp(value, "auto"))
            o->kv_type = BACKEND_KV_AUTO;
        else if (!strcmp(value, "f32"))
            o->kv_type = BACKEND_KV_F32;
        else if (!strcmp(value, "f16"))
            o->kv_type = BACKEND_KV_F16;
        else {
            fprintf(stderr, "inferd: --kv-dtype: '%s' is not auto, f32 or f16\n", value);
            return -1;
        }
        return 1;
    }
    if (!strcmp(flag, "--cuda-qgemv")) {
        if (!strcmp(value, "mixed") || !strcmp(value, "stream")) {
            o->cuda_qgemv_dp4a = BACKEND_ON;
            o->cuda_qgemv_stream = BACKEND_ON;
            o->cuda_qgemv_mixed = !strcmp(value, "mixed") ? BACKEND_ON : BACKEND_OFF;
        } else if (!strcmp(value, "dp4a")) {
            o->cuda_qgemv_dp4a = BACKEND_ON;
            o->cuda_qgemv_stream = BACKEND_OFF;
        } else if (!strcmp(value, "float"))
            o->cuda_qgemv_dp4a = BACKEND_OFF;
        else {
            fprintf(stderr, "inferd: --cuda-qgemv: '%s' is not mixed, stream, dp4a or float\n",
                    value);
            return -1;
        }
        return 1;
    }
    if (!strcmp(flag, "--cuda-gemv-rows")) {
        char *end;
        long v = strtol(value, &end, 10);
        if (*value == '\0' || *end != '\0' || v < 1 || v > 8) {
            fprintf(stderr, "inferd: --cuda-gemv-rows: '%s' is not a number from 1 to 8\n", value);
            return -1;
        }
        o->cuda_gemv_rows = (int)v;
        return 1;
    }
    if (!strcmp(flag, "--cuda-profile")) {
        if (!strcmp(value, "off"))
            o->profile = BACKEND_PROFILE_OFF;
        else if (!strcmp(value, "ops"))
            o->profile = BACKEND_PROFILE_OPS;
        else if (!strcmp(value, "graphs"))
            o->profile = BACKEND_PROFILE_GRAPHS;
        else {
            fprintf(stderr, "inferd: --cuda-profile: '%s' is not off, ops or graphs\n", value);
            return -1;
        }
        return 1;
    }
    return 0;
}

int cli_quantize_flag(const char *flag, const char *value, enum dtype *out)
{
    if (strcmp(flag, "--quantize"))
        return 0;
    if (!strcmp(value, "q8_0"))
        *out = DTYPE_Q8_0;
    else if (!strcmp(value, "q4_k"))
        *out = DTYPE_Q4_K;
    else {
        fprintf(stderr, "inferd: --quantize: '%s' is not q8_0 or q4_k\n", value);
        return -1;
    }
    return 1;
}

int cli_kv_quant_flag(const char *flag, const char *value, struct cli_kv_quant *q)
{
    if (!strcmp(flag, "--kv-quant-config")) {
        q->config_path = value;
        return 1;
    }
    if (strcmp(flag, "--kv-quant"))
        return 0;
    if (strcmp(value, "config")) {
        struct kv_quant probe;
        bool on;
        struct err err = {0};
        if (kv_quant_parse(value, &probe, &on, &err) < 0) {
            fprintf(stderr, "inferd: --kv-quant: %s\n", err.msg);
            return -1;
        }
    }
    q->mode = value;
    return 1;
}

int cli_kv_quant_resolve(struct cli_kv_quant *q, const char *model_dir,
                         struct backend_options *opt, struct err *err)
{
    bool config = (q->mode && !strcmp(q->mode, "config")) || (!q->mode && q->config_path);
    if (q->config_path && q->mode && !config)
        return err_set(err, INFERD_EINVAL, "--kv-quant-config needs --kv-quant config, not '%s'",
                       q->mode);
    if (!config) {
        bool on = false;
        if (!q->mode)
            return 0;
        int rc = kv_quant_parse(q->mode, &q->quant, &on, err);
        if (rc < 0)
            return err_wrap(err, "--kv-quant");
        if (on)
            opt->kv_quant = &q->quant;
        return 0;
    }
    struct model_config c;
    struct generation_defaults gen;
    int rc = model_config_load(model_dir, &c, &gen, err);
    if (rc < 0)
        return rc;
    char path[4096];
    if (q->config_path)
        snprintf(path, sizeof path, "%s", q->config_path);
    else
        snprintf(path, sizeof path, "%s/kv_config.json", model_dir);
    rc = kv_quant_config_load(path, c.n_layers, &q->quant, err);
    if (rc < 0)
        return rc;
    opt->kv_quant = &q->quant;
    return 0;
}

int cli_backend_create(const char *device, const struct backend_options *opt,
                       struct backend **out, struct err *err)
{
    struct device_spec spec = {DEVICE_CPU, 0};
    if (device && !cli_device_parse(device, &spec))
        return err_set(err, INFERD_EINVAL, "--device: '%s' is not cpu, cuda, cuda:N or auto",
                       device);
    if (spec.kind == DEVICE_AUTO)
        spec.kind = backend_cuda_device_count() > 0 ? DEVICE_CUDA : DEVICE_CPU;
    if (spec.kind == DEVICE_CUDA)
        return backend_cuda_create(spec.index, opt, out, err);
    return backend_cpu_create(opt, out, err);
}

int cli_tp_flag(const char *flag, const char *value, struct cli_tp_flags *f)
{
    if (!strcmp(flag, "--tensor-parallel"))
        return arg_int(flag, value, 1, COLLECTIVE_MAX_RANKS, &f->n) ? 1 : -1;
    if (!strcmp(flag, "--nccl-lib")) {
        f->nccl_lib = value;
        return 1;
    }
    return 0;
}

int cli_model_flag(const char *flag, const char *value, const struct cli_model_flags *f)
{
    int r = cli_backend_flag(flag, value, f->backend);
    if (r == 0)
        r = cli_kv_quant_flag(flag, value, f->kvq);
    if (r == 0)
        r = cli_quantize_flag(flag, value, f->quantize);
    if (r == 0)
        r = cli_tp_flag(flag, value, f->tp);
    if (r == 0)
        r = cli_spec_flag(flag, value, f->spec);
    return r;
}

struct cli_tp {
    int n;
    struct backend *bes[COLLECTIVE_MAX_RANKS]; /* [0] is the caller's */
    struct collective *comms[COLLECTIVE_MAX_RANKS];
};

void cli_tp_free(struct cli_tp *tp)
{
    if (!tp)
        return;
    for (int r = 0; r < tp->n; r++) {
        collective_destroy(tp->comms[r]);
        if (r > 0)
            backend_destroy(tp->bes[r]);
    }
    free(tp);
}

/* The ranks' backends and communicators into tp. */
static int tp_ranks_create(const char *device, const struct backend_options *opt,
                           struct cli_tp *tp, const char *nccl_lib, struct err *err)
{
    struct device_spec spec = {DEVICE_CPU, 0};
    if (device && !cli_device_parse(device, &spec))
        return err_set(err, INFERD_EINVAL, "--device: '%s' is not cpu, cuda, cuda:N or auto",
                       device);
    if (spec.kind == DEVICE_AUTO)
        spec.kind = backend_cuda_device_count() > 0 ? DEVICE_CUDA : DEVICE_CPU;
    int n = tp->n, rc;
    if (spec.kind == DEVICE_CUDA) {
        int have = backend_cuda_device_count();
        if (spec.index + n > have)
            return err_set(err, INFERD_EINVAL, "--tensor-parallel %d from cuda:%d needs GPUs %d.."
                           "%d; %d found", n, spec.index, spec.index, spec.index + n - 1, have);
        int devices[COLLECTIVE_MAX_RANKS];
        for (int r = 0; r < n; r++)
            devices[r] = spec.index + r;
        /* NCCL first: without it nothing else is worth making */
        if ((rc = collective_nccl_create(n, devices, nccl_lib, tp->comms, err)) < 0)
            return rc;
        for (int r = 0; r < n; r++)
            if ((rc = backend_cuda_create(devices[r], opt, &tp->bes[r], err)) < 0)
                return err_wrap(err, "rank %d", r), rc;
        return 0;
    }
    struct backend_options ro = *opt;
    int threads = opt->threads > 0 ? opt->threads : cpu_features()->n_cores;
    ro.threads = threads / n > 0 ? threads / n : 1;
    if ((rc = collective_host_create(n, tp->comms, err)) < 0)
        return rc;
    for (int r = 0; r < n; r++)
        if ((rc = backend_cpu_create(&ro, &tp->bes[r], err)) < 0)
            return rc;
    return 0;
}

int cli_model_open(const char *device, const struct backend_options *opt,
                   const struct cli_tp_flags *f, const char *dir,
                   const struct model_load_options *lo, struct backend **be, struct model **m,
                   struct cli_tp **tp, struct err *err)
{
    *be = NULL;
    *m = NULL;
    *tp = NULL;
    int rc;
    if (!f || f->n <= 1) {
        if ((rc = cli_backend_create(device, opt, be, err)) < 0)
            return rc;
        return model_load_with(dir, *be, lo, m, err);
    }
    struct cli_tp *t = calloc(1, sizeof *t);
    if (!t)
        return err_set(err, INFERD_ENOMEM, "out of memory for %ld ranks", f->n);
    t->n = (int)f->n;
    if ((rc = tp_ranks_create(device, opt, t, f->nccl_lib, err)) < 0 ||
        (rc = model_load_parallel(dir, t->bes, t->comms, t->n, lo, m, err)) < 0) {
        struct backend *b0 = t->bes[0];
        cli_tp_free(t);
        backend_destroy(b0);
        return rc;
    }
    *be = t->bes[0];
    *tp = t;
    return 0;
}

void cli_backend_describe(struct backend *be, char *buf, size_t cap)
{
    if (!cap)
        return;
    buf[0] = '\0';
    if (!be)
        return;
    struct threadpool *pool = backend_cpu_threadpool(be);
    if (pool) {
        snprintf(buf, cap, "cpu, %d threads", threadpool_size(pool));
        return;
    }
    char gpu[200];
    backend_cuda_describe(be, gpu, sizeof gpu);
    snprintf(buf, cap, "%s %s", be->ops->name, gpu);
}
