/* cli_render.c — `kvbatch render`: what each request of a job prefills.
 *
 * Every line goes through run's own steps (admit.h): its checks, its
 * parse, admit_prepare with run's template and context (which gives the
 * token ids run would submit), then admit_prompt_text for the text those
 * ids were tokenized from. So a line renders exactly when run would run it,
 * with the ids run would prefill, and a bad line shows the error run would
 * write. Nothing is computed: the weights are mapped (model_load refuses
 * what run refuses) but never read for a forward pass. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app/admit.h"
#include "app/cli.h"
#include "app/cli_util.h"
#include "base/alloc.h"
#include "base/json.h"
#include "jobs/job.h"
#include "model/model.h"
#include "text/chat.h"
#include "text/tok.h"

enum { RENDER_EXIT_BAD_LINES = 3 };

static void usage(FILE *f)
{
    fprintf(f, "usage: kvbatch render --input JOBS.jsonl [options]\n"
               "\n"
               "Prints what `kvbatch run` would prefill for each request of a JSONL job: the\n"
               "exact prompt text after the chat template (control tokens as their text) and,\n"
               "with --ids, its token ids, with the template that was used. It goes through\n"
               "run's own code for each line (checks, template, tokenization, context check), so\n"
               "what it prints is what runs. A completion prompt prints as given; one given as\n"
               "token ids prints the ids and their decoding. One entry per prompt (a prompt\n"
               "list gives several; n > 1 does not). A bad line prints the error run would\n"
               "write for it, and the rest go on.\n"
               "\n"
               "  -m, --model PATH         GGUF model (default: $KVBATCH_MODEL or\n"
               "                           models/SmolLM2-135M-Instruct.Q4_1.gguf); only its tokenizer,\n"
               "                           template and sizes are used\n"
               "  -i, --input PATH         the job file ('-' = standard input)\n"
               "      --line N             only input line N (1-based, as in error messages)\n"
               "      --ids                print the token ids too\n"
               "      --format FMT         text (default): per prompt a header line\n"
               "                             # line N custom_id=ID [prompt=K/P] template=NAME tokens=T\n"
               "                           (NAME: the template's source@hash, e.g.\n"
               "                           tokenizer.chat_template@a1b2c3d4e5f6, or a built-in family's name)\n"
               "                           then the text as it is (\"\\ no newline at the end\" when it\n"
               "                           has none) and, with --ids, \"# ids: …\"; a bad line is\n"
               "                             # line N custom_id=ID error=CODE param=FIELD: MESSAGE\n"
               "                           json: one object per request line: custom_id, line, template\n"
               "                           (null for completions), prompt_tokens (run's\n"
               "                           usage.prompt_tokens), prompts [{text, n_tokens, ids}],\n"
               "                           error (null, or run's error object: code, message, param, line)\n"
               "      --chat-template NAME|FILE  as for run (default: the model's tokenizer.chat_template)\n"
               "  -c, --ctx N              as for run: most tokens per sequence (default: min(model's, 4096));\n"
               "                           a prompt that does not fit is a context_length_exceeded line\n"
               "  -h, --help               this text\n"
               "\n"
               "Exit status: 0 every request line rendered; 1 the model or input could not be\n"
               "read, or --line is past the end; 2 bad command line; 3 some lines are bad (each\n"
               "printed with its error).\n");
}

struct render {
    const struct tok *tok;
    bool ids, json;
    struct kvb_buf buf; /* the line being written */
    int64_t n_lines, n_bad;
    bool write_failed;
};

/* Appends text (len bytes) to b, NUL-terminated after; false when out of memory. */
static bool put(struct kvb_buf *b, const char *text, size_t len)
{
    if (kvb_buf_reserve(b, len + 1) != KVB_OK) return false;
    memcpy(b->data + b->len, text, len);
    b->len += len;
    b->data[b->len] = '\0';
    return true;
}

static bool puts_(struct kvb_buf *b, const char *s) { return put(b, s, strlen(s)); }

static bool putf(struct kvb_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool putf(struct kvb_buf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return n >= 0 && put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A message on one line of the text form: a custom_id quoted in it may hold
 * control characters (JSON escapes them; the text form must not break). */
static bool put_oneline(struct kvb_buf *b, const char *s)
{
    bool ok = true;
    for (; *s && ok; s++) {
        const unsigned char c = (unsigned char)*s;
        ok = c >= 0x20 && c != 0x7f ? put(b, s, 1) : putf(b, c == '\n' ? "\\n" : "\\x%02x", c);
    }
    return ok;
}

static bool put_json_str(struct kvb_buf *b, const char *s, size_t len) { return json_put_string(b, s, len) == KVB_OK; }

/* The custom_id as run writes it: as it was written between its quotes. */
static bool put_custom_id(struct render *r, const struct job_request *q)
{
    struct kvb_buf *b = &r->buf;
    if (!q || !q->custom_id_json) return puts_(b, r->json ? "null" : "(none)");
    if (!r->json) return put(b, q->custom_id_json, q->custom_id_json_len);
    return puts_(b, "\"") && put(b, q->custom_id_json, q->custom_id_json_len) && puts_(b, "\"");
}

static bool flush_line(struct render *r)
{
    if (r->write_failed) return false;
    if (fwrite(r->buf.data, 1, r->buf.len, stdout) != r->buf.len) {
        fprintf(stderr, "kvbatch render: cannot write the output: %s\n", strerror(errno));
        r->write_failed = true;
    }
    r->buf.len = 0;
    return !r->write_failed;
}

/* A bad line: the error object of the line run would write. */
static bool emit_error(struct render *r, const struct job_request *q, const struct job_error *e)
{
    struct kvb_buf *b = &r->buf;
    r->n_bad++;
    bool ok;
    if (r->json) {
        const unsigned long long line = (unsigned long long)e->line_no;
        ok = puts_(b, "{\"custom_id\":") && put_custom_id(r, q) && putf(b, ",\"line\":%llu,", line) &&
             puts_(b, "\"error\":{\"code\":") && put_json_str(b, e->code, strlen(e->code)) &&
             puts_(b, ",\"message\":") && put_json_str(b, e->message, strlen(e->message)) && puts_(b, ",\"param\":") &&
             (e->param[0] ? put_json_str(b, e->param, strlen(e->param)) : puts_(b, "null")) &&
             (line ? putf(b, ",\"line\":%llu}}\n", line) : puts_(b, ",\"line\":null}}\n"));
    } else {
        ok = putf(b, "# line %llu custom_id=", (unsigned long long)e->line_no) && put_custom_id(r, q) &&
             putf(b, " error=%s", e->code) && (!e->param[0] || putf(b, " param=%s", e->param)) && puts_(b, ": ") &&
             put_oneline(b, e->message) && puts_(b, "\n");
    }
    if (!ok) {
        fprintf(stderr, "kvbatch render: out of memory\n");
        return false;
    }
    return flush_line(r);
}

/* The text of a prompt given as token ids: their decoding, control tokens
 * shown as their text. *out kvb_malloc'd. */
static enum kvb_status decode_shown(const struct tok *t, const int32_t *ids, int32_t n, char **out, size_t *len)
{
    struct tok_stream s;
    tok_stream_init(&s, t);
    size_t cap = 0;
    *out = NULL;
    *len = 0;
    enum kvb_status st = KVB_OK;
    for (int32_t i = 0; i < n && st == KVB_OK; i++) st = tok_stream_push_special(t, &s, ids[i], out, len, &cap);
    if (st == KVB_OK) st = tok_stream_flush(t, &s, out, len, &cap);
    if (st == KVB_OK && !*out) {
        *out = kvb_malloc(1);
        if (!*out) st = KVB_ERR_NOMEM;
        else (*out)[0] = '\0';
    }
    if (st != KVB_OK) {
        kvb_free(*out);
        *out = NULL;
    }
    return st;
}

static bool put_ids(struct kvb_buf *b, const struct admit_prompt *p, const char *sep)
{
    for (int32_t i = 0; i < p->n; i++)
        if (!putf(b, "%s%d", i ? sep : "", p->ids[i])) return false;
    return true;
}

/* Prompt k of an admitted line: its header and text (text form) or its
 * entry of the "prompts" list (json). */
static bool put_prompt(struct render *r, const struct job_request *q, const struct admit_plan *plan, int32_t k,
                       const char *tmpl, const char *text, size_t len)
{
    struct kvb_buf *b = &r->buf;
    const struct admit_prompt *p = &plan->prompts[k];
    if (r->json) {
        return puts_(b, k ? ",{\"text\":" : "{\"text\":") && put_json_str(b, text, len) &&
               putf(b, ",\"n_tokens\":%d", p->n) &&
               (!r->ids || (puts_(b, ",\"ids\":[") && put_ids(b, p, ",") && puts_(b, "]"))) && puts_(b, "}");
    }
    const bool given = q->url != JOB_URL_CHAT && q->prompts[k].ids;
    bool ok = putf(b, "# line %llu custom_id=", (unsigned long long)q->line_no) && put_custom_id(r, q) &&
              (plan->n_prompts == 1 || putf(b, " prompt=%d/%d", k + 1, plan->n_prompts)) &&
              putf(b, " template=%s tokens=%d%s\n", q->url == JOB_URL_CHAT ? tmpl : "none", p->n,
                   given ? " (token ids as given; the text is their decoding)" : "") &&
              put(b, text, len);
    if (ok && (len == 0 || text[len - 1] != '\n')) ok = puts_(b, "\n\\ no newline at the end\n");
    if (ok && r->ids) ok = puts_(b, "# ids: ") && put_ids(b, p, " ") && puts_(b, "\n");
    return ok;
}

/* An admitted line: every prompt's text (admit_prompt_text, the text its
 * ids came from) with the ids admit_prepare made. */
static bool emit_plan(struct render *r, const struct admit_ctx *ctx, const struct job_request *q,
                      const struct admit_plan *plan)
{
    struct kvb_buf *b = &r->buf;
    bool ok = true;
    char tmpl[256];
    admit_template_label(ctx, q, tmpl, sizeof tmpl);
    if (r->json) {
        int64_t total = 0;
        for (int32_t k = 0; k < plan->n_prompts; k++) total += plan->prompts[k].n;
        ok = puts_(b, "{\"custom_id\":") && put_custom_id(r, q) &&
             putf(b, ",\"line\":%llu,\"template\":", (unsigned long long)q->line_no) &&
             (q->url == JOB_URL_CHAT ? put_json_str(b, tmpl, strlen(tmpl)) : puts_(b, "null")) &&
             putf(b, ",\"prompt_tokens\":%lld,\"prompts\":[", (long long)total);
    }
    for (int32_t k = 0; k < plan->n_prompts && ok; k++) {
        struct admit_text t;
        struct job_error e;
        char *decoded = NULL;
        size_t dlen = 0;
        enum kvb_status st = admit_prompt_text(ctx, q, k, &t, &e);
        if (st == KVB_OK && !t.text)
            st = decode_shown(r->tok, plan->prompts[k].ids, plan->prompts[k].n, &decoded, &dlen);
        if (st == KVB_OK) ok = put_prompt(r, q, plan, k, tmpl, t.text ? t.text : decoded, t.text ? t.len : dlen);
        else ok = false; /* admit_prepare rendered this very text a moment ago: only memory can fail */
        kvb_free(decoded);
        admit_text_free(&t);
    }
    if (ok && r->json) ok = puts_(b, "],\"error\":null}\n");
    if (!ok) {
        fprintf(stderr, "kvbatch render: out of memory\n");
        return false;
    }
    return flush_line(r);
}

/* One non-blank line through run's steps (runner.c admit_one, without what
 * belongs to a run: resume, shards, the crash journal). upto_only: a line
 * before --line's, read only for the custom_ids a later line may repeat.
 * False on a fatal error. */
static bool render_line(struct render *r, struct admit_ctx *ctx, struct job_idset *seen, const struct job_line *ln,
                        bool upto_only)
{
    struct job_error e;
    if (!upto_only) r->n_lines++;
    if (admit_check_length(ln, &e) != KVB_OK) return upto_only || emit_error(r, NULL, &e);
    struct job_request q;
    enum kvb_status st = job_parse_line(ln->data, ln->len, ln->line_no, &q, &e);
    struct grammar *schema = NULL;
    if (st == KVB_OK) st = admit_constraint(&q, &schema, &e); /* run's order: part of reading the line */
    if (st == KVB_OK) st = admit_check_unique(seen, &q, &e);
    bool ok = true;
    if (st != KVB_OK || upto_only) {
        grammar_free(schema);
        if (st != KVB_OK && !upto_only) ok = emit_error(r, &q, &e);
    } else {
        struct admit_plan plan;
        if (admit_prepare(ctx, &q, schema, &plan, &e) != KVB_OK) ok = emit_error(r, &q, &e);
        else ok = emit_plan(r, ctx, &q, &plan);
        admit_plan_free(&plan);
    }
    job_request_free(&q);
    return ok;
}

/* Every line of the input (or --line's, after reading those before it for
 * their custom_ids). False on a fatal error, said on stderr. */
static bool render_all(struct render *r, struct admit_ctx *ctx, struct job_reader *reader, struct job_idset *seen,
                       const char *input, int64_t line_only)
{
    struct kvb_err err = {{0}};
    bool found = false;
    for (;;) {
        struct job_line ln;
        bool got = false;
        if (job_reader_next(reader, &ln, &got, &err) != KVB_OK) {
            fprintf(stderr, "kvbatch render: cannot read %s: %s\n", input, err.msg);
            return false;
        }
        if (!got) break;
        const bool mine = !line_only || ln.line_no == (uint64_t)line_only;
        if (line_only && ln.line_no > (uint64_t)line_only) break;
        if (job_line_is_blank(ln.data, ln.len)) { /* run writes nothing for it */
            if (mine && line_only)
                fprintf(stderr, "kvbatch render: line %lld is blank (run writes nothing for it)\n",
                        (long long)line_only);
            found |= mine;
            continue;
        }
        found |= mine;
        if (!render_line(r, ctx, seen, &ln, !mine)) return false;
    }
    if (line_only && !found) {
        fprintf(stderr, "kvbatch render: --line %lld: %s has fewer lines\n", (long long)line_only,
                strcmp(input, "-") ? input : "standard input");
        return false;
    }
    return true;
}

int cli_render(int argc, char **argv)
{
    char model_buf[PATH_MAX];
    cli_default_model(model_buf, sizeof model_buf);
    const char *model_path = model_buf, *input = NULL, *tmpl_name = NULL;
    int64_t line_only = 0, v;
    int32_t n_ctx_opt = 0;
    struct render r = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return CLI_EXIT_OK;
        } else if (!strcmp(a, "-m") || cli_opt_is(a, "--model")) {
            CLI_VAL();
            model_path = val;
        } else if (!strcmp(a, "-i") || cli_opt_is(a, "--input")) {
            CLI_VAL();
            input = val;
        } else if (cli_opt_is(a, "--line")) {
            CLI_VAL();
            if (!cli_parse_i64(a, val, 1, INT64_MAX, &line_only)) return CLI_EXIT_USAGE;
        } else if (!strcmp(a, "--ids")) r.ids = true;
        else if (cli_opt_is(a, "--format")) {
            CLI_VAL();
            if (strcmp(val, "text") && strcmp(val, "json")) {
                fprintf(stderr, "kvbatch render: --format expects text or json, got '%s'\n", val);
                return CLI_EXIT_USAGE;
            }
            r.json = !strcmp(val, "json");
        } else if (cli_opt_is(a, "--chat-template")) {
            CLI_VAL();
            tmpl_name = val;
        } else if (!strcmp(a, "-c") || cli_opt_is(a, "--ctx")) {
            CLI_VAL();
            if (!cli_parse_i64(a, val, 16, 1 << 20, &v)) return CLI_EXIT_USAGE;
            n_ctx_opt = (int32_t)v;
        } else {
            fprintf(stderr, "kvbatch render: unknown option '%s' (see --help)\n", a);
            return CLI_EXIT_USAGE;
        }
    }
    if (!input) {
        fprintf(stderr, "kvbatch render: --input is required (see --help)\n");
        return CLI_EXIT_USAGE;
    }

    int rc = CLI_EXIT_FAIL;
    struct kvb_err err = {{0}};
    struct model *m = NULL;
    struct tok *tok = NULL;
    struct chat_template tmpl = {0};
    bool have_tmpl = false;
    char tmpl_error[sizeof err.msg];
    struct admit_ctx ctx = {0};
    struct job_reader *reader = NULL;
    struct job_idset *seen = NULL;
    FILE *in = strcmp(input, "-") ? fopen(input, "rb") : stdin;
    if (!in) {
        fprintf(stderr, "kvbatch render: cannot open %s: %s\n", input, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    if (model_load(model_path, &m, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch render: cannot load model: %s\n", err.msg);
        goto out;
    }
    if (tok_load(m->gguf, &tok, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch render: cannot load the tokenizer: %s\n", err.msg);
        goto out;
    }
    if (admit_template_choose(m, tok, tmpl_name, &tmpl, &have_tmpl, tmpl_error, sizeof tmpl_error, &err) != KVB_OK) {
        fprintf(stderr, "kvbatch render: --chat-template: %s\n", err.msg);
        rc = CLI_EXIT_USAGE; /* a bad name or file is a bad command line */
        goto out;
    }
    if (admit_ctx_init(&ctx, tok, have_tmpl ? &tmpl : NULL, tmpl_error, m->hp.n_vocab, admit_n_ctx(m, n_ctx_opt)) !=
            KVB_OK ||
        job_reader_create(in, 0, &reader, &err) != KVB_OK || job_idset_create(&seen) != KVB_OK) {
        fprintf(stderr, "kvbatch render: out of memory\n");
        goto out;
    }
    ctx.now = admit_clock();
    r.tok = tok;
    if (!render_all(&r, &ctx, reader, seen, input, line_only)) goto out;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        if (!r.write_failed) fprintf(stderr, "kvbatch render: cannot write the output: %s\n", strerror(errno));
        goto out;
    }
    rc = CLI_EXIT_OK;
    if (r.n_bad) {
        fprintf(stderr, "kvbatch render: %lld of %lld request lines are bad (exit %d)\n", (long long)r.n_bad,
                (long long)r.n_lines, RENDER_EXIT_BAD_LINES);
        rc = RENDER_EXIT_BAD_LINES;
    }
out:
    kvb_buf_free(&r.buf);
    job_idset_free(seen);
    job_reader_free(reader);
    admit_ctx_free(&ctx);
    chat_template_free(&tmpl);
    tok_free(tok);
    model_free(m);
    if (in != stdin) fclose(in);
    return rc;
}
