/* cli/commands.h — the inferd subcommands; each returns the process exit status. */
#ifndef INFERD_CLI_COMMANDS_H
#define INFERD_CLI_COMMANDS_H

int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_serve(int argc, char **argv);
/* serve --isolate's engine child (cli/cmd_serve.c), run as `inferd ENGINE_CHILD_COMMAND ...`;
 * hidden from help. */
#define ENGINE_CHILD_COMMAND "__engine"
int cmd_serve_engine(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);

#endif
