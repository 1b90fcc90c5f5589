/* cli/device.h — the `--device cpu|cuda[:N]|auto` flag and the backend flags: parsing them and creating the backend they name. */
#ifndef INFERD_CLI_DEVICE_H
#define INFERD_CLI_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"
#include "cli/spec_flags.h"
#include "model/model.h"

enum device_kind { DEVICE_CPU, DEVICE_CUDA, DEVICE_AUTO };

struct device_spec {
    enum device_kind kind;
    int index; /* GPU number for DEVICE_CUDA */
};

/* "cpu", "cuda", "cuda:N" or "auto"; false (with a message naming the
 * flag) for anything else. */
bool cli_device_parse(const char *text, struct device_spec *out);

/* The backend flags every command that loads a model takes, for its usage text. */
#define CLI_BACKEND_USAGE                                                                        \
    "Backend flags (each overrides its environment variable, which still works):\n"              \
    "  --cpu-isa avx2|avx512|avx512bf16|amx  highest CPU instruction set used (INFERD_CPU)\n"     \
    "  --kv-dtype auto|f32|f16     KV cache elements; auto: f16 in fast mode, f32 in exact mode\n" \
    "                              (INFERD_CUDA_KV=f32)\n"                                       \
    "  --gpu-sampling on|off       pick tokens on the GPU; off: logits to the host\n"            \
    "                              (INFERD_CUDA_SAMPLE=0)\n"                                     \
    "  --cuda-graphs on|off        replay decode steps from CUDA graphs (INFERD_CUDA_GRAPHS=0)\n" \
    "  --cuda-pdl on|off           programmatic dependent launches (INFERD_CUDA_PDL=0)\n"        \
    "  --cuda-norm-fusion on|off   RMSNorm folded into the decode GEMV\n"                        \
    "                              (INFERD_CUDA_NORM_FUSION=0)\n"                                \
    "  --cuda-qk-fusion on|off     q/k norm + RoPE + KV write folded into decode attention\n"    \
    "                              (INFERD_CUDA_QK_ATTN=0)\n"                                    \
    "  --cuda-qk-span-fusion on|off  ... also for a speculative verify span of up to 8 tokens\n" \
    "                              (default off; INFERD_CUDA_QK_SPAN=1)\n"                       \
    "  --cuda-norm-sums on|off     fast-mode RMSNorm of 3-8 rows folded into the skinny GEMM\n" \
    "                              after it, from sums of squares the GEMM before it left\n"   \
    "                              (default: verify steps only; INFERD_CUDA_NORM_SUMS=1|0)\n"    \
    "  --cuda-add-norm-fusion on|off  a residual add and the RMSNorm after it in one launch\n"  \
    "                              (INFERD_CUDA_ADD_NORM=0)\n"                                   \
    "  --cuda-gemm-x-fusion on|off  the RMSNorm or SwiGLU before a cuBLASLt GEMM writes its\n" \
    "                              x in bf16 (INFERD_CUDA_GEMM_X=0)\n"                          \
    "  --cuda-gemm-bf16-swiglu on|off  a prefill's gate/up GEMM writes bf16 products for the\n" \
    "                              SwiGLU after it (INFERD_CUDA_GEMM_BF16_SWIGLU=0)\n"          \
    "  --cuda-gemm-residual on|off  a cuBLASLt GEMM adds into the residual stream itself\n"    \
    "                              (INFERD_CUDA_GEMM_RESIDUAL=0)\n"                            \
    "  --cuda-prefill-tc on|off    fast-mode prefill attention on tensor cores\n"                \
    "                              (INFERD_CUDA_PREFILL_TC=0)\n"                                 \
    "  --cuda-prefill-wgmma on|off  that prefill on warp-group tensor cores (sm_90a GPUs;\n"  \
    "                              INFERD_CUDA_PREFILL_WGMMA=0)\n"                           \
    "  --cuda-qprefill-ws on|off   that prefill over a quantized cache with warps that only\n"  \
    "                              decode records beside those that attend (sm_90a GPUs)\n"   \
    "                              (INFERD_CUDA_QPREFILL_WS=0)\n"                               \
    "  --cuda-qprefill-pair on|off  with wgmma, its blocks in clusters of two that decode\n"  \
    "                              K and V apart for both (INFERD_CUDA_QPREFILL_PAIR=0)\n"   \
    "  --cuda-qprefill-window on|off  that prefill from the records decoded once a step\n"   \
    "                              into an f16 window (INFERD_CUDA_QPREFILL_WINDOW=0)\n"      \
    "  --cuda-decode-tc on|off     fast-mode decode attention of more than 8 sequences (any\n"  \
    "                              number over a quantized cache) on tensor cores\n"           \
    "                              (INFERD_CUDA_DECODE_TC=0)\n"                                 \
    "  --cuda-moe on|off           MoE experts on vectorised GEMVs and a grouped tensor-core\n"  \
    "                              GEMM; off: the first kernels (INFERD_CUDA_MOE=0)\n"          \
    "  --cuda-qgemv mixed|stream|dp4a|float  fast-mode Q8_0/Q4_K/Q6_K decode GEMVs on int8\n" \
    "                              x with dp4a; mixed (default): Q4_K and Q6_K in one launch\n" \
    "                              that quantizes x itself, a Q4_K and a Q6_K product over\n"  \
    "                              one x together; stream: a launch for each type\n"         \
    "                              (INFERD_CUDA_QGEMV=stream); dp4a: x quantized by a\n"     \
    "                              launch of its own (INFERD_CUDA_QGEMV=dp4a); float: x in\n"  \
    "                              f32 as exact mode (INFERD_CUDA_QGEMV=float)\n"             \
    "  --cuda-gemv-rows N          fast-mode matmuls of more rows than N (1-8, default 2)\n"     \
    "                              leave the GEMV kernels\n"                                   \
    "  --cuda-skinny-gemm on|off   fast-mode bf16 matmuls of 3-8 rows on tensor cores, each\n"   \
    "                              weight read once; off: cuBLASLt (INFERD_CUDA_SKINNY=0)\n"   \
    "  --cuda-batch-gemm on|off    fast-mode bf16 matmuls of 9-64 rows on a tensor-core tile\n"  \
    "                              GEMM (default off: cuBLASLt; INFERD_CUDA_BATCH_GEMM=1)\n"   \
    "  --cuda-wgmma-gemm on|off    fast-mode bf16 matmuls of 9-128 rows on cuBLASLt's path\n" \
    "                              on a warp-group tensor-core GEMM instead (sm_90a GPUs;\n" \
    "                              default off: cuBLASLt; INFERD_CUDA_WGMMA_GEMM=1)\n"       \
    "  --cuda-lora-rows on|off     fast-mode adapter shrinks and expands folded into the\n"    \
    "                              RMSNorm and SwiGLU launches (default off: two launches\n"  \
    "                              an adapter group; INFERD_CUDA_LORA_ROWS=1)\n"             \
    "  --cuda-profile off|ops|graphs  log GPU time per launch kind, or graph replays, at exit\n" \
    "                              (INFERD_CUDA_PROFILE)\n"

/* --kv-quant and --kv-quant-config, for the commands that load a model. */
#define CLI_KV_QUANT_USAGE                                                                       \
    "KV cache quantization:\n"                                                                   \
    "  --kv-quant off|8|4|config|turbo[:kXvY]  the KV cache's format (default off): affine 8 or\n" \
    "                              4 bits per group of 64 (8g32, 4g32: of 32); turbo: TurboQuant\n" \
    "                              (rotated, Lloyd-Max codes) with X key and Y value bits, each\n"  \
    "                              2, 3, 4, 5 or 8 (bare turbo: k8v3; :qjl after it spends one\n"  \
    "                              key bit on the QJL residual); config: per layer, from\n"       \
    "                              kv_config.json in the model directory\n"                      \
    "  --kv-quant-config FILE      the per-layer config to read instead (implies config)\n"

/* --quantize, for the commands that load a model. */
#define CLI_QUANTIZE_USAGE                                                                       \
    "Weights:\n"                                                                                 \
    "  --quantize q8_0|q4_k        quantize a bf16/f16/f32 checkpoint in memory at load (CPU;\n"   \
    "                              q4_k keeps the LM head at q6_k, as Q4_K_M files do)\n"

/* --quantize's value into *out (DTYPE_Q8_0 or DTYPE_Q4_K): 1 when flag is
 * it, 0 when it is not, -1 (after a message) for another value. */
int cli_quantize_flag(const char *flag, const char *value, enum dtype *out);

/* What --kv-quant and --kv-quant-config ask for, resolved against the model
 * directory before the backend is made. */
struct cli_kv_quant {
    const char *mode;        /* borrowed (argv); NULL: off */
    const char *config_path; /* borrowed (argv); NULL: DIR/kv_config.json under config */
    struct kv_quant quant;   /* where backend_options.kv_quant points once resolved */
};

/* One of the two flags with its value into *q: 1 when flag is one, 0 when it
 * is not, -1 (after a message naming the flag) for a value that is no format. */
int cli_kv_quant_flag(const char *flag, const char *value, struct cli_kv_quant *q);

/* Fills q->quant for the model in model_dir (a per-layer config is read and
 * checked against its layer count here, so a bad file stops start-up) and
 * points opt->kv_quant at it; leaves opt alone for off. */
int cli_kv_quant_resolve(struct cli_kv_quant *q, const char *model_dir,
                         struct backend_options *opt, struct err *err);

/* The backend options the environment asks for (INFERD_CPU, INFERD_CUDA_*),
 * read here and nowhere else, each as inferd has always read it; zero
 * (every default) for what is unset. */
void cli_backend_options_from_env(struct backend_options *out);

/* One backend flag of CLI_BACKEND_USAGE with its value into *o: 1 when flag
 * is one, 0 when it is not, -1 (after a message naming the flag) when value
 * is not one of its choices. */
int cli_backend_flag(const char *flag, const char *value, struct backend_options *o);

/* Creates the backend device names (NULL: "cpu"). "auto" is the first GPU
 * when inferd has CUDA and a GPU is present, else the CPU. */
int cli_backend_create(const char *device, const struct backend_options *opt,
                       struct backend **out, struct err *err);

/* --tensor-parallel N and --nccl-lib PATH, for the commands that load a model. */
#define CLI_TP_USAGE                                                                             \
    "Tensor parallelism:\n"                                                                       \
    "  --tensor-parallel N         split the model over N ranks (Megatron-style: heads, MLP\n"    \
    "                              rows and vocabulary); with --device cuda[:I], GPUs I..I+N-1\n" \
    "                              summing through NCCL; on the CPU, N ranks sharing --threads\n" \
    "                              (default 1: one device, as without the flag)\n"              \
    "  --nccl-lib PATH             the NCCL library to open (INFERD_NCCL_LIB; default\n"        \
    "                              libnccl.so.2 from the loader's search path)\n"

struct cli_tp_flags {
    long n;               /* ranks; 0 or 1: none */
    const char *nccl_lib; /* borrowed (argv); NULL: INFERD_NCCL_LIB or the default */
};

/* One of the two flags with its value into *f: 1 when flag is one, 0 when
 * it is not, -1 (after a message naming the flag) for a bad value. */
int cli_tp_flag(const char *flag, const char *value, struct cli_tp_flags *f);

/* Where the flags of the commands that run a model land: CLI_BACKEND_USAGE's,
 * --kv-quant and --kv-quant-config, --quantize, --tensor-parallel and
 * --nccl-lib, and the speculative decoding flags. */
struct cli_model_flags {
    struct backend_options *backend;
    struct cli_kv_quant *kvq;
    enum dtype *quantize;
    struct cli_tp_flags *tp;
    struct cli_spec_options *spec;
};

/* One of those flags with its value into f: 1 when flag is one, 0 when it is
 * not, -1 (after a message naming the flag) for a bad value. */
int cli_model_flag(const char *flag, const char *value, const struct cli_model_flags *f);

/* The ranks of a tensor-parallel model other than rank 0, and the
 * communicators of all of them (owned). */
struct cli_tp;

/* Creates the backend device names and loads dir onto it: with f NULL or
 * f->n <= 1 that is cli_backend_create and model_load_with (*tp NULL);
 * else the model is split over f->n ranks (model_load_parallel): *be is
 * rank 0's backend, *tp the rest, freed with cli_tp_free after model_free
 * and before backend_destroy(*be). CPU ranks share opt->threads (each
 * threads / N, at least 1); CUDA ranks are GPUs index .. index + N - 1,
 * summing through NCCL. */
int cli_model_open(const char *device, const struct backend_options *opt,
                   const struct cli_tp_flags *f, const char *dir,
                   const struct model_load_options *lo, struct backend **be, struct model **m,
                   struct cli_tp **tp, struct err *err);
void cli_tp_free(struct cli_tp *tp);

/* One line saying what be runs on, for logs and benchmark headers. */
void cli_backend_describe(struct backend *be, char *buf, size_t cap);

#endif
