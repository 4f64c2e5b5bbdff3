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
#include "base/json.h"
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
               "      --jsonl       many texts: each line of standard input is one JSON string,\n"
               "                    and each gives one line of ids, in order (one process for\n"
               "                    thousands of texts, as an evaluation adapter needs)\n"
               "  -h, --help        this text\n"
               "\n"
               "Exit status: 0 done, 1 the model or input could not be read, 2 bad usage.\n");
}

static void print_ids(const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
}

/* --jsonl: each line of in[0..len) a JSON string, its ids a line of the
 * output. False after saying which line was bad. */
static bool encode_lines(const struct tok *t, const char *in, size_t len, unsigned flags)
{
    size_t at = 0;
    for (uint64_t line_no = 1; at < len; line_no++) {
        const char *nl = memchr(in + at, '\n', len - at);
        size_t n = nl ? (size_t)(nl - (in + at)) : len - at;
        if (n && in[at + n - 1] == '\r') n--;
        struct json_doc j;
        const char *why = "not a JSON string";
        size_t where = 0;
        char *text = NULL;
        size_t text_len = 0;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        struct kvb_err err = {{0}};
        bool ok = json_parse(in + at, n, &j, &why, &where) == KVB_OK && json_kind(&j, 0) == JSON_STRING &&
                  json_str_dup(&j, 0, &text, &text_len) == KVB_OK;
        json_free(&j);
        if (!ok) {
            fprintf(stderr, "kvbatch tokenize: standard input line %llu: %s (each line must be one JSON string)\n",
                    (unsigned long long)line_no, why);
            kvb_free(text);
            return false;
        }
        if (tok_encode(t, text, text_len, flags, &ids, &n_ids, &err) != KVB_OK) {
            fprintf(stderr, "kvbatch tokenize: standard input line %llu: %s\n", (unsigned long long)line_no, err.msg);
            kvb_free(text);
            return false;
        }
        print_ids(ids, n_ids);
        kvb_free(ids);
        kvb_free(text);
        at += (nl ? (size_t)(nl - (in + at)) + 1 : len - at);
    }
    return true;
}

int cli_tokenize(int argc, char **argv)
{
    char model_buf[PATH_MAX];
    cli_default_model(model_buf, sizeof model_buf);
    const char *model = model_buf, *text_arg = NULL;
    unsigned flags = 0;
    bool opts_done = false, jsonl = false;
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
            else if (!strcmp(a, "--jsonl")) jsonl = true;
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

    if (jsonl && text_arg) {
        fprintf(stderr, "kvbatch tokenize: --jsonl reads its texts from standard input, not TEXT\n");
        return CLI_EXIT_USAGE;
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
    if (jsonl) {
        if (!encode_lines(t, input, len, flags)) goto out;
    } else {
        if (tok_encode(t, text_arg ? text_arg : input, len, flags, &ids, &n, &err) != KVB_OK) {
            fprintf(stderr, "kvbatch tokenize: %s\n", err.msg);
            goto out;
        }
        print_ids(ids, n);
    }
    rc = fflush(stdout) == 0 && !ferror(stdout) ? CLI_EXIT_OK : CLI_EXIT_FAIL;
    if (rc != CLI_EXIT_OK) fprintf(stderr, "kvbatch tokenize: cannot write the ids\n");
out:
    kvb_free(ids);
    tok_free(t);
    gguf_close(f);
    free(input);
    return rc;
}
