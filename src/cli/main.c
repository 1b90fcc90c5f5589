/* cli/main.c — the inferd binary: dispatches to subcommands. */
#include <stdio.h>
#include <string.h>

#include "base/cpu.h"
#include "cli/commands.h"

#ifndef INFERD_VERSION
#error "INFERD_VERSION comes from CMakeLists.txt's project() version"
#endif

static void print_usage(FILE *out)
{
    fputs("inferd " INFERD_VERSION ", a local LLM inference server\n"
          "\n"
          "usage: inferd COMMAND [ARGS]     (inferd COMMAND --help for its usage)\n"
          "\n"
          "commands:\n"
          "  run DIR (-p TEXT [--chat] | --tokens IDS) [-n N] [--temp T] [--top-k K]\n"
          "          [--top-p P] [--min-p P] [--seed S] [--threads N] [--mode fast|exact] [--ctx N]\n"
          "          [--device cpu|cuda[:N]|auto]\n"
          "      generate from a Hugging Face model directory or a GGUF file; prints text\n"
          "      for -p, generated ids (comma-separated) for --tokens. --chat sends TEXT as a\n"
          "      user message through the model's chat template\n"
          "  serve DIR [--host H] [--port P] [--api-key KEY] [--max-tokens N] [--ctx N] ...\n"
          "      serve the OpenAI API over HTTP (`inferd serve --help` lists every flag);\n"
          "      --device picks the CPU or a GPU as for run\n"
          "  bench DIR [--prompt-len P] [--gen-len G] [--chunk C] [--threads N] [--mode fast|exact]\n"
          "          [--device cpu|cuda[:N]|auto]\n"
          "      prefill and decode speed, with the memory-bandwidth floor\n"
          "  mkmodel --preset NAME [--arch ARCH] [--seed S] [--tokenizer TDIR] --out DIR | --list\n"
          "      write a deterministic test model in Hugging Face format\n"
          "  tokenize DIR [--no-special] TEXT | tokenize DIR --jsonl [--no-special]\n"
          "      token ids (and pieces) of TEXT, or of each JSON string line of stdin\n"
          "  template DIR [--no-join]\n"
          "      render the chat template for each JSON line of stdin (messages, tools,\n"
          "      add_generation_prompt, template variables)\n"
          "  version, --version\n"
          "      print the version\n"
          "  help\n"
          "      this text\n",
          out);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        puts("inferd " INFERD_VERSION);
        return 0;
    }
    if (!cpu_features()->avx2) {
        fprintf(stderr, "inferd: this CPU lacks AVX2/FMA, which inferd requires\n");
        return 1;
    }
    if (!strcmp(cmd, "run"))
        return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve"))
        return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, ENGINE_CHILD_COMMAND))
        return cmd_serve_engine(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench"))
        return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "mkmodel"))
        return cmd_mkmodel(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize"))
        return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "template"))
        return cmd_template(argc - 1, argv + 1);
    fprintf(stderr, "inferd: unknown command '%s'\n\n", cmd);
    print_usage(stderr);
    return 2;
}
