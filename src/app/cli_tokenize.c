/* cli_tokenize.c — `kvbatch tokenize`: prints the token ids of a text.
 *
 * Opens only the GGUF metadata and the tokenizer (no weights are touched), so
 * it works on vocab-only files such as the tokenizer test vocabularies. The
 * text is the one argument, or all of standard input byte for byte; by
 * default nothing is added and special-token text is ordinary text, which is
 * what the reference's test vectors list. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/cli.h"
#include "app/cli_util.h"
#include "base/alloc.h"
#include "model/gguf.h"
#include "text/tok.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvbatch tokenize [options] [--] [TEXT]\n"
               "\n"
               "Prints the token ids of TEXT (or of all of standard input, read byte for\n"
               "byte, when TEXT is absent) on one line, separated by spaces.\n"
               "\n"
               "  -m, --model PATH  GGUF file whose tokenizer to use; vocab-only files work\n"
               "                    (default: $KVBATCH_MODEL, else\n"
               "                    models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
               "      --bos         put the model's BOS token first (default: add nothing)\n"
               "      --special     text of special tokens such as <|im_start|> becomes those\n"
               "                    tokens (default: it is tokenized as plain text)\n"
               "  -h, --help        this text\n"
               "\n"
               "Exit status: 0 done, 1 the model or input could not be read, 2 bad usage.\n");
}

int cli_tokenize(int argc, char **argv)
{
    char model_buf[PATH_MAX];
    cli_default_model(model_buf, sizeof model_buf);
    const char *model = model_buf, *text_arg = NULL;
    unsigned flags = 0;
    bool opts_done = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!opts_done && a[0] == '-' && a[1] != '\0') {
            if (!strcmp(a, "--")) opts_done = true;
            else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
                usage(stdout);
                return CLI_EXIT_OK;
            } else if (!strcmp(a, "-m") || cli_opt_is(a, "--model")) {
                if (!(model = cli_opt_value(argc, argv, &i))) return CLI_EXIT_USAGE;
            } else if (!strcmp(a, "--bos")) flags |= TOK_ADD_BOS;
            else if (!strcmp(a, "--special")) flags |= TOK_PARSE_SPECIAL;
            else {
                fprintf(stderr, "kvbatch tokenize: unknown option '%s' (see --help)\n", a);
                return CLI_EXIT_USAGE;
            }
            continue;
        }
        if (text_arg) {
            fprintf(stderr, "kvbatch tokenize: one TEXT at most (quote it, or pipe it on stdin)\n");
            return CLI_EXIT_USAGE;
        }
        text_arg = a;
    }

    char *input = NULL; /* from cli_read_stream: plain malloc */
    size_t len = 0;
    if (text_arg) {
        len = strlen(text_arg);
    } else {
        input = cli_read_stream(stdin, &len);
        if (!input) {
            fprintf(stderr, "kvbatch tokenize: cannot read standard input\n");
            return CLI_EXIT_FAIL;
        }
    }

    int rc = CLI_EXIT_FAIL;
    struct kvb_err err = {{0}};
    struct gguf_file *f = NULL;
    struct tok *t = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (gguf_open(model, &f, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch tokenize: cannot open %s: %s\n", model, err.msg);
        goto out;
    }
    if (tok_load(f, &t, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch tokenize: cannot load the tokenizer of %s: %s\n", model, err.msg);
        goto out;
    }
    if ((flags & TOK_ADD_BOS) && tok_bos(t) < 0)
        fprintf(stderr, "kvbatch tokenize: warning: %s has no BOS token; --bos adds nothing\n", model);
    if (tok_encode(t, text_arg ? text_arg : input, len, flags, &ids, &n, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch tokenize: %s\n", err.msg);
        goto out;
    }
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    rc = fflush(stdout) == 0 && !ferror(stdout) ? CLI_EXIT_OK : CLI_EXIT_FAIL;
    if (rc != CLI_EXIT_OK) fprintf(stderr, "kvbatch tokenize: cannot write the ids\n");
out:
    kvb_free(ids);
    tok_free(t);
    gguf_close(f);
    free(input);
    return rc;
}
