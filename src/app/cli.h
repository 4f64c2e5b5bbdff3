/* cli.h — the kvbatch commands. Each takes the arguments after the command
 * name (argv[0] is the command) and returns the process exit code
 * (see cli_util.h: 0 ok, 1 failed, 2 bad usage). */
#ifndef KVB_CLI_H
#define KVB_CLI_H

int cli_generate(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_logits(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_render(int argc, char **argv);
int cli_report(int argc, char **argv);
int cli_cache(int argc, char **argv);
int cli_info(int argc, char **argv);

#endif
