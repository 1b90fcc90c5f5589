/* cli/cmd_mkmodel.c — `inferd mkmodel`: write a deterministic test model directory, or list the presets. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "tools/gguf_write.h"
#include "tools/mlx_write.h"
#include "tools/mklora.h"
#include "tools/mkmodel.h"
#include "tools/mkwhisper.h"

static const char usage[] =
    "usage: inferd mkmodel --preset NAME [--arch ARCH] [--seed S] [--tokenizer TDIR] [--layers N]\n"
    "                      --out DIR\n"
    "       inferd mkmodel ... --format gguf --dtype bf16|q8_0|q4_0|q4_k_m|q6_k --out FILE.gguf\n"
    "       inferd mkmodel ... --format mlx --bits 4|8 --group-size 32|64|128 --out DIR\n"
    "       inferd mkmodel --preset whisper-test|whisper-test-128|whisper-tiny|whisper-base --out DIR\n"
    "       inferd mkmodel --lora-for MDIR [--rank R] [--alpha A] [--rslora]\n"
    "                      [--targets q_proj,v_proj,...|regex:PATTERN] [--seed S] --out ADIR\n"
    "       inferd mkmodel --list\n"
    "Writes config.json, generation_config.json and model.safetensors with\n"
    "deterministic weights (same preset and seed: same bytes on every machine).\n"
    "--arch alone picks tiny-ARCH; with --preset it must match the preset's.\n"
    "--seed defaults to 1. Files already in DIR are overwritten.\n"
    "--layers N keeps the preset's first N layers only: a real shape's layers in a\n"
    "small file, for benchmarks of a layer (the same tensors as the full preset's).\n"
    "--tokenizer copies TDIR's tokenizer.json, tokenizer_config.json (and\n"
    "special_tokens_map.json) into DIR and fits the model to them: vocab_size\n"
    "covers every token, bos/eos ids are the tokenizer's (eos also the chat\n"
    "template's end-of-turn token, e.g. <|im_end|>).\n"
    "--format gguf writes the same model as one GGUF file instead (the tokenizer\n"
    "as tokenizer.ggml.* metadata), its matrices in --dtype's types as\n"
    "llama-quantize picks them (default bf16); the bytes are deterministic too.\n"
    "--format mlx writes the same model MLX-quantized, as mlx-community publishes\n"
    "models: packed uint32 weights with per-group scales and biases for every\n"
    "matrix (default 4 bits, groups of 64), quantization in config.json.\n"
    "--lora-for writes a random PEFT LoRA adapter for the model in MDIR instead\n"
    "(adapter_config.json, adapter_model.safetensors in f32; default rank 8,\n"
    "alpha 16, every projection the architecture has), deterministic per seed.\n";

/* Removes the files of a scratch directory, then the directory. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[4200];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* The model written to a scratch directory beside out, then converted. */
static int write_gguf(struct mkmodel_opts *o, enum gguf_ftype ftype, struct err *err)
{
    char scratch[4200];
    snprintf(scratch, sizeof scratch, "%s.dir.XXXXXX", o->out_dir);
    if (!mkdtemp(scratch))
        return err_set(err, INFERD_EIO, "cannot create a scratch directory beside %s", o->out_dir);
    const char *out = o->out_dir;
    o->out_dir = scratch;
    int rc = mkmodel_write(o, err);
    o->out_dir = out;
    if (!rc)
        rc = gguf_write_model(scratch, ftype, out, err);
    remove_dir(scratch);
    return rc;
}

/* The model written to a scratch directory beside out, then quantized into out. */
static int write_mlx(struct mkmodel_opts *o, int bits, int group, struct err *err)
{
    char scratch[4200];
    snprintf(scratch, sizeof scratch, "%s.src.XXXXXX", o->out_dir);
    if (!mkdtemp(scratch))
        return err_set(err, INFERD_EIO, "cannot create a scratch directory beside %s", o->out_dir);
    const char *out = o->out_dir;
    o->out_dir = scratch;
    int rc = mkmodel_write(o, err);
    o->out_dir = out;
    if (!rc)
        rc = mlx_write_model(scratch, bits, group, out, err);
    remove_dir(scratch);
    return rc;
}

static void print_size(char *out, size_t cap, uint64_t bytes)
{
    if (bytes >= (1ull << 30))
        snprintf(out, cap, "%.1f GiB", (double)bytes / (double)(1ull << 30));
    else if (bytes >= (1ull << 20))
        snprintf(out, cap, "%.1f MiB", (double)bytes / (double)(1ull << 20));
    else
        snprintf(out, cap, "%.0f KiB", (double)bytes / 1024.0);
}

static const char *rope_name(enum mkmodel_rope r)
{
    return r == MKMODEL_ROPE_LINEAR ? "linear" : r == MKMODEL_ROPE_LLAMA3 ? "llama3" : "none";
}

static void list_presets(void)
{
    int n;
    const struct mkmodel_preset *p = mkmodel_presets(&n);
    printf("%-18s %-8s %-5s %7s %6s %6s %6s %5s %3s %4s %-5s %-7s %8s %10s\n", "preset", "arch",
           "dtype", "vocab", "hidden", "inter", "layers", "heads", "kv", "hdim", "tied", "rope",
           "theta", "size");
    for (int i = 0; i < n; i++) {
        char size[32];
        print_size(size, sizeof size, mkmodel_file_bytes(&p[i]));
        printf("%-18s %-8s %-5s %7d %6d %6d %6d %5d %3d %4d %-5s %-7s %8s %10s\n", p[i].name,
               p[i].arch, dtype_name(p[i].dtype), p[i].vocab_size, p[i].hidden_size,
               p[i].intermediate_size, p[i].n_layers, p[i].n_heads, p[i].n_kv_heads,
               p[i].head_dim, p[i].tie_word_embeddings ? "yes" : "no", rope_name(p[i].rope),
               p[i].rope_theta, size);
    }
    const struct mkwhisper_preset *w = mkwhisper_presets(&n);
    printf("\n%-18s %6s %4s %4s %5s %5s %4s %s\n", "whisper preset", "d", "enc", "dec", "heads",
           "ffn", "mels", "vocab");
    for (int i = 0; i < n; i++)
        printf("%-18s %6d %4d %4d %5d %5d %4d %s\n", w[i].name, w[i].d_model, w[i].encoder_layers,
               w[i].decoder_layers, w[i].heads, w[i].ffn, w[i].n_mels,
               w[i].real_vocab ? "51865" : "1865");
}

int cmd_mkmodel(int argc, char **argv)
{
    struct mkmodel_opts o = {.seed = 1};
    struct mklora_opts lo = {.rank = 8, .alpha = 16};
    bool list = false, gguf = false, mlx = false;
    int bits = 4, group = 64, layers = 0;
    enum gguf_ftype ftype = GGUF_FTYPE_BF16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--list")) {
            list = true;
            continue;
        }
        if (!strcmp(a, "--rslora")) {
            lo.rslora = true;
            continue;
        }
        if (!strcmp(a, "--lora-for") || !strcmp(a, "--rank") || !strcmp(a, "--alpha") ||
            !strcmp(a, "--targets")) {
            if (!(v = arg_value(argc, argv, &i)))
                return 2;
            if (!strcmp(a, "--lora-for"))
                lo.model_dir = v;
            else if (!strcmp(a, "--rank"))
                lo.rank = atoi(v);
            else if (!strcmp(a, "--alpha"))
                lo.alpha = atof(v);
            else
                lo.targets = v;
            continue;
        }
        if (strcmp(a, "--arch") && strcmp(a, "--preset") && strcmp(a, "--seed") &&
            strcmp(a, "--out") && strcmp(a, "--tokenizer") && strcmp(a, "--format") &&
            strcmp(a, "--dtype") && strcmp(a, "--bits") && strcmp(a, "--group-size") &&
            strcmp(a, "--layers")) {
            fprintf(stderr, "inferd mkmodel: unknown argument '%s'\n%s", a, usage);
            return 2;
        }
        if (!(v = arg_value(argc, argv, &i)))
            return 2;
        if (!strcmp(a, "--arch"))
            o.arch = v;
        else if (!strcmp(a, "--preset"))
            o.preset = v;
        else if (!strcmp(a, "--out"))
            o.out_dir = v;
        else if (!strcmp(a, "--tokenizer"))
            o.tokenizer_dir = v;
        else if (!strcmp(a, "--format")) {
            if (strcmp(v, "gguf") && strcmp(v, "safetensors") && strcmp(v, "mlx")) {
                fprintf(stderr, "inferd mkmodel: --format must be safetensors, gguf or mlx\n");
                return 2;
            }
            gguf = !strcmp(v, "gguf");
            mlx = !strcmp(v, "mlx");
        } else if (!strcmp(a, "--bits")) {
            bits = atoi(v);
            if (bits != 4 && bits != 8) {
                fprintf(stderr, "inferd mkmodel: --bits must be 4 or 8\n");
                return 2;
            }
        } else if (!strcmp(a, "--group-size")) {
            group = atoi(v);
            if (group != 32 && group != 64 && group != 128) {
                fprintf(stderr, "inferd mkmodel: --group-size must be 32, 64 or 128\n");
                return 2;
            }
        } else if (!strcmp(a, "--layers")) {
            layers = atoi(v);
            if (layers < 1) {
                fprintf(stderr, "inferd mkmodel: --layers must be a positive number\n");
                return 2;
            }
        } else if (!strcmp(a, "--dtype")) {
            if (!gguf_ftype_parse(v, &ftype)) {
                fprintf(stderr, "inferd mkmodel: --dtype must be bf16, q8_0, q4_0, q4_k_m or q6_k\n");
                return 2;
            }
        }
        else if (!arg_u64(a, v, &o.seed))
            return 2;
    }
    if (list) {
        list_presets();
        return 0;
    }
    if (!o.out_dir) {
        fprintf(stderr, "inferd mkmodel: --out DIR is required\n%s", usage);
        return 2;
    }
    struct err err = {0};
    if (lo.model_dir) {
        lo.out_dir = o.out_dir;
        lo.seed = o.seed;
        if (mklora_write(&lo, &err) != 0) {
            fprintf(stderr, "inferd mkmodel: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    if (o.preset && mkwhisper_preset_find(o.preset)) {
        if (mkwhisper_write(o.preset, o.seed, o.out_dir, &err) != 0) {
            fprintf(stderr, "inferd mkmodel: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    struct mkmodel_preset shape;
    if (layers) {
        const struct mkmodel_preset *p = o.preset ? mkmodel_preset_find(o.preset) : NULL;
        if (!p) {
            fprintf(stderr, "inferd mkmodel: --layers needs the --preset it shortens\n");
            return 2;
        }
        if (layers > p->n_layers) {
            fprintf(stderr, "inferd mkmodel: --layers %d: preset %s has %d layers\n", layers,
                    p->name, p->n_layers);
            return 2;
        }
        shape = *p;
        shape.n_layers = layers;
        if (layers < 32)
            shape.mlp_only_layers &= (1u << layers) - 1u;
        o.shape = &shape;
    }
    if ((gguf  ? write_gguf(&o, ftype, &err)
         : mlx ? write_mlx(&o, bits, group, &err)
               : mkmodel_write(&o, &err)) != 0) {
        fprintf(stderr, "inferd mkmodel: %s\n", err.msg);
        return 1;
    }
    return 0;
}
