/* job.h — JSONL batch jobs: request lines in, result lines out, resume.
 *
 * This module knows the OpenAI Batch file formats and nothing about models:
 * it turns one input line into a struct job_request (or a struct job_error
 * naming the line and the field), formats result and error lines, streams
 * lines of any length from a FILE*, keeps sets of ids, and scans an earlier
 * output file so an interrupted run can resume. Tokenization, chat templates
 * and generation live in src/; the run loop that ties them together is the
 * caller of everything here.
 *
 * Input, one JSON object per line, in either form:
 *   {"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"messages":[…],…}}
 *   {"custom_id":"b","method":"POST","url":"/v1/completions","body":{"prompt":"…",…}}
 *   {"custom_id":"c","messages":[…],"temperature":0}      shorthand: fields at top level
 *   {"custom_id":"d","prompt":"…","max_tokens":16}
 * In the batch form `method` and `url` may be omitted (then `url` is inferred
 * from the body: `messages` → chat, `prompt` → completion). Every field is
 * either read (and does what OpenAI or vLLM says it does), ignored on purpose
 * because it means nothing offline (job_field_ignored), or refused by name
 * (JOB_ERR_UNSUPPORTED_FIELD): a field kvbatch silently dropped would change
 * what the caller gets back without saying so. A JSON `null` for an optional
 * field means "not given".
 *
 * Text decoding (documented choice): JSON *syntax* errors, invalid escapes
 * such as "\x" among them, make the line invalid_json. Damaged *text* does not:
 * a lone UTF-16 surrogate escape ("\ud800"), \u0000, and bytes that are not
 * valid UTF-8 are each replaced with U+FFFD. Pipelines that cut strings in the
 * middle of an emoji produce such text, and one bad character should not cost
 * the request. So every decoded string is valid UTF-8 with no NUL inside, and
 * is also NUL-terminated.
 *
 * custom_id is the exception: it names the request, so it is never repaired.
 * Output lines echo it exactly as written (custom_id_json), and it is told
 * from other ids in its exact form (json_str_dup_exact: "x\ud800" and
 * "x\udfff" are two ids, not both "x\uFFFD"). Raw bytes that are not valid
 * UTF-8 in a custom_id are refused: they could not be written back as JSON.
 *
 * Numbers are read with strtod and written with snprintf: the process must
 * keep the default "C" LC_NUMERIC locale (kvbatch never calls setlocale).
 *
 * Output ids are deterministic (see job_key_*): a rerun over the same input
 * writes identical lines apart from `created`, which the caller passes in.
 *
 * Ownership: a struct job_request owns every string it points to until
 * job_request_free. Formatting functions only read their inputs. Strings
 * handed to job_idset are copied. */
#ifndef KVB_JOB_H
#define KVB_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/buf.h"
#include "base/status.h"

/* ---- limits ------------------------------------------------------------------ */

#define JOB_MAX_STOP 8                           /* stop strings per request */
#define JOB_MAX_N 16                             /* choices per prompt ("n") */
#define JOB_MAX_PROMPTS 128                      /* prompts in one completion line (a list: one set of choices each) */
#define JOB_MAX_CHOICES 128                      /* choices per line: prompts x n */
#define JOB_MAX_STOP_TOKEN_IDS 256               /* stop_token_ids per request */
#define JOB_MAX_TOP_LOGPROBS 20                  /* alternatives per token */
#define JOB_MAX_LOGIT_BIAS 1024                  /* logit_bias entries per request */
#define JOB_MAX_LINE_DEFAULT ((size_t)256 << 20) /* 256 MiB; the parser's hard cap is 1 GiB */

/* ---- errors -------------------------------------------------------------------- */

/* Error codes written into error lines (OpenAI style). The last three are
 * raised by the caller, not by job_parse_line. */
#define JOB_ERR_INVALID_JSON "invalid_json"
#define JOB_ERR_INVALID_REQUEST "invalid_request" /* valid JSON, wrong shape (not an object, …) */
#define JOB_ERR_MISSING_FIELD "missing_field"
#define JOB_ERR_INVALID_TYPE "invalid_type"
#define JOB_ERR_INVALID_VALUE "invalid_value"         /* right type, out of range or not allowed */
#define JOB_ERR_UNSUPPORTED_FIELD "unsupported_field" /* a field kvbatch does not implement (or knows not) */
#define JOB_ERR_DUPLICATE_CUSTOM_ID "duplicate_custom_id"
#define JOB_ERR_CONTEXT_LENGTH "context_length_exceeded"
#define JOB_ERR_SERVER "server_error" /* kvbatch failed (out of memory, …): status 500 */

struct job_error {
    const char *code;  /* one of the JOB_ERR_* strings (static) */
    uint64_t line_no;  /* 1-based input line */
    char param[128];   /* the field at fault, e.g. "body.temperature"; "" when none */
    char message[512]; /* "line 7: field 'body.temperature' must be a number" */
    bool by_line;      /* keyed by line number even with a custom_id (job_key_error): set by
                          job_parse_line for lines that do not parse, whose custom_id a later
                          line may still own; job_error_setf clears it */
};

/* Fills e: message = "line N: " + the formatted text (truncated to fit).
 * param may be NULL. For the caller's own errors (duplicate ids, context
 * length, server errors). */
void job_error_setf(struct job_error *e, const char *code, uint64_t line_no, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* ---- requests ---------------------------------------------------------------- */

enum job_url {
    JOB_URL_CHAT = 0,   /* /v1/chat/completions */
    JOB_URL_COMPLETION, /* /v1/completions */
};

enum job_role {
    JOB_ROLE_SYSTEM = 0,
    JOB_ROLE_USER,
    JOB_ROLE_ASSISTANT,
    JOB_ROLE_DEVELOPER, /* OpenAI's newer name for system; chat templates should treat it as system */
};

/* "system", "user", "assistant", "developer". */
const char *job_role_name(enum job_role r);

struct job_message {
    enum job_role role;
    char *content;      /* NUL-terminated UTF-8; array content = text parts joined with "\n" (as vLLM does) */
    size_t content_len; /* bytes, without the NUL */
};

/* Bits of job_request.given: which optional fields the line set (non-null). */
enum job_given {
    JOB_GIVEN_MODEL = 1u << 0,
    JOB_GIVEN_MAX_TOKENS = 1u << 1, /* max_tokens or max_completion_tokens */
    JOB_GIVEN_TEMPERATURE = 1u << 2,
    JOB_GIVEN_TOP_P = 1u << 3,
    JOB_GIVEN_TOP_K = 1u << 4,
    JOB_GIVEN_MIN_P = 1u << 5,
    JOB_GIVEN_SEED = 1u << 6,
    JOB_GIVEN_STOP = 1u << 7,
    JOB_GIVEN_PRESENCE_PENALTY = 1u << 8,
    JOB_GIVEN_FREQUENCY_PENALTY = 1u << 9,
    JOB_GIVEN_REPETITION_PENALTY = 1u << 10,
    JOB_GIVEN_N = 1u << 11,
    JOB_GIVEN_LOGPROBS = 1u << 12,
    JOB_GIVEN_TOP_LOGPROBS = 1u << 13,
    JOB_GIVEN_RESPONSE_FORMAT = 1u << 14,
    JOB_GIVEN_LOGIT_BIAS = 1u << 15,
    JOB_GIVEN_MIN_TOKENS = 1u << 16,
    JOB_GIVEN_STOP_TOKEN_IDS = 1u << 17,
    JOB_GIVEN_ECHO = 1u << 18,
    JOB_GIVEN_PROMPT_LOGPROBS = 1u << 19,
};

/* One prompt of a completion line: text, or token ids as given. */
struct job_prompt {
    char *text; /* NUL-terminated UTF-8, or NULL when the prompt is token ids */
    size_t text_len;
    int32_t *ids;  /* (n_ids) token ids >= 0, used as given (no BOS added); checked against the
                         vocabulary by the caller, who knows it; NULL for a text prompt */
    int32_t n_ids; /* >= 1 when ids */
};

/* Defaults for absent fields. temperature and top_p follow OpenAI; max_tokens
 * is bounded because a batch job should not run to the context limit unasked.
 * The default seed is a constant, so a request without a seed is reproducible
 * run after run (two requests with the same prompt and no seed therefore get
 * the same sample; give seeds or use n > 1 to vary them). */
#define JOB_DEFAULT_MAX_TOKENS 256
#define JOB_DEFAULT_TEMPERATURE 1.0f
#define JOB_DEFAULT_TOP_P 1.0f
#define JOB_DEFAULT_SEED 0u

struct job_logit_bias {
    int32_t token;
    float value; /* [-100, 100] */
};

enum job_constraint {
    JOB_CONSTRAINT_NONE,
    JOB_CONSTRAINT_JSON,    /* json_object, and json_schema when that is set */
    JOB_CONSTRAINT_REGEX,   /* the whole output is one match (Python's re.fullmatch) */
    JOB_CONSTRAINT_CHOICE,  /* the output is one of the strings */
    JOB_CONSTRAINT_GRAMMAR, /* the output is a sentence of the GBNF grammar (llama.cpp's format) */
};

struct job_request {
    uint64_t line_no; /* 1-based input line */
    char *custom_id;  /* its exact decoded form (json_str_dup_exact: lone surrogates kept, not
                              valid UTF-8 then), NUL-terminated, no NUL inside; the identity that keys,
                              duplicates and shards use; set as soon as it is read, so also on most errors */
    size_t custom_id_len;
    char *custom_id_json; /* the same id as written between its quotes in the input (escapes kept):
                              what output lines carry, byte for byte; set with custom_id */
    size_t custom_id_json_len;
    enum job_url url;
    bool shorthand; /* fields were at top level rather than under "body" */
    char *model;    /* recorded as given, or NULL */

    struct job_message *messages; /* chat: n_messages >= 1; completion: NULL */
    size_t n_messages;
    char *chat_template; /* chat: the request's own Jinja template (decoded, NUL-terminated), or NULL */
    size_t chat_template_len;
    char *chat_template_kwargs; /* chat: chat_template_kwargs, a JSON object as written, or NULL */
    size_t chat_template_kwargs_len;
    struct job_prompt *prompts; /* completion: (n_prompts) >= 1, from "prompt": a string, a list of
                                   strings, a list of token ids, or a list of such lists; chat: NULL */
    int32_t n_prompts;
    char *prompt; /* completion: prompts[0].text (borrowed from it; NULL when token ids); chat: NULL */
    size_t prompt_len;

    uint32_t given;           /* enum job_given bits */
    int32_t max_tokens;       /* >= 1 (0 allowed with echo or prompt_logprobs: the prompt is only scored);
                              max_completion_tokens wins over max_tokens; default 256 */
    float temperature;        /* [0, 2]; 0 = greedy; default 1 */
    float top_p;              /* (0, 1]; default 1 (off) */
    int32_t top_k;            /* >= 0; 0 = off (default); vLLM's -1 is read as 0 */
    float min_p;              /* [0, 1]; default 0 (off) */
    uint64_t seed;            /* default 0; a negative JSON seed is taken modulo 2^64 */
    char *stop[JOB_MAX_STOP]; /* non-empty NUL-terminated strings */
    size_t stop_len[JOB_MAX_STOP];
    int n_stop;
    float presence_penalty;            /* [-2, 2]; default 0 */
    float frequency_penalty;           /* [-2, 2]; default 0 */
    float repetition_penalty;          /* (0, 2]; default 1 (off) */
    int32_t n;                         /* [1, 16]; default 1 */
    bool logprobs;                     /* chat: "logprobs": true; completion: "logprobs": k given */
    int32_t top_logprobs;              /* [0, 20]: alternatives per token (completion: the k above) */
    bool json_object;                  /* "response_format": {"type": "json_object"}: the output is one JSON object */
    struct job_logit_bias *logit_bias; /* (n_logit_bias) distinct token ids; ids not checked here */
    int32_t n_logit_bias;
    char *json_schema; /* "json_schema": the schema's JSON text as written in the line (owned,
                                 NUL-terminated; the engine compiles it: gschema_to_gbnf);
                                 json_object is set too */
    size_t json_schema_len;
    /* The output constraint, at most one a request (a second is an error
     * naming both fields): response_format json_object or json_schema,
     * structured_outputs {json | json_object | regex | choice | grammar}, or
     * vLLM's older guided_json, guided_regex, guided_choice, guided_grammar.
     * A JSON one also sets json_object (and json_schema when it has one:
     * structured_outputs.json and guided_json given as a string are read as
     * the schema's text). The engine compiles the rest (app/admit.c). */
    uint8_t constraint;    /* enum job_constraint */
    char *constraint_text; /* regex and grammar (GBNF): the string decoded; choice: the JSON array
                              of strings as written in the line (owned, NUL-terminated) */
    size_t constraint_len;
    char constraint_param[128]; /* the field it came in: "body.guided_regex" */

    /* vLLM's sampling extensions */
    bool ignore_eos;         /* end-of-generation tokens do not end the output (max_tokens does) */
    int32_t min_tokens;      /* [0, max_tokens]: until this many tokens, end-of-generation tokens and
                                 stop_token_ids cannot be drawn and stop strings are not looked for */
    int32_t *stop_token_ids; /* (n_stop_token_ids) ids >= 0 that end the output with finish "stop";
                                 ids not checked here */
    int32_t n_stop_token_ids;
    bool include_stop_str_in_output; /* the stop string (or stop token's text) stays in the output */
    bool skip_special_tokens;        /* default true: control tokens add no text */
    /* chat templating (chat only) */
    bool add_generation_prompt;  /* default true: the template's opening of the assistant's turn */
    bool continue_final_message; /* the last message (an assistant's) is left open and continued;
                                        needs add_generation_prompt false */
    /* scoring */
    bool echo;               /* completions: "echo": true: the prompt comes back before the generated text,
                                 and (with logprobs) its tokens before the generated ones, the first one's
                                 logprob null */
    int32_t prompt_logprobs; /* vLLM's "prompt_logprobs": k in [0, 20] alternatives per prompt token
                                 (both endpoints); -1 not asked (absent or null) */
};

/* Whether q asks for its prompt to be scored (echo with logprobs, or
 * prompt_logprobs); max_tokens may then be 0. */
static inline bool job_scores_prompt(const struct job_request *q)
{
    return (q->echo && q->logprobs) || q->prompt_logprobs >= 0;
}

/* Whether a request field named `name` (at the top of a body) is one that
 * means nothing offline and is ignored on purpose: stream, stream_options,
 * user, store, metadata, service_tier, priority, prompt_cache_key,
 * safety_identifier, parallel_tool_calls (without tools), cache_salt. */
bool job_field_ignored(const char *name);

/* Parses one input line (len bytes, need not be NUL-terminated, may end in
 * "\r"; no "\n" inside). `out` is always initialised, so call
 * job_request_free on it whatever the result. Returns:
 *   KVB_OK           out holds the request;
 *   KVB_ERR_FORMAT   the line is bad: err says why (code, param, message
 *                    naming line_no and the field); out->custom_id is set
 *                    when the line had a usable one;
 *   KVB_ERR_NOMEM    err holds a server_error.
 * Never stops the job: every input gives one of these. */
enum kvb_status job_parse_line(const char *line, size_t len, uint64_t line_no, struct job_request *out,
                               struct job_error *err);

void job_request_free(struct job_request *r); /* frees the strings, zeroes r; accepts NULL */

/* ---- output keys ----------------------------------------------------------- */

/* Every output line carries a deterministic key, 32 lowercase hex digits:
 * id "batch_req_<key>", request_id "req_<key>", body id "chatcmpl-<key>" or
 * "cmpl-<key>". A line for a request with a first-seen custom_id is keyed by
 * the custom_id alone (so reordering the input keeps its ids); an error line
 * for an input line without a usable custom_id, or with a duplicate one, is
 * keyed by its line number. Resume compares keys (job_resume_scan). */
#define JOB_KEY_LEN 32
struct job_key {
    char hex[JOB_KEY_LEN + 1];
};
void job_key_custom_id(const char *custom_id, size_t len, struct job_key *out);
void job_key_line(uint64_t line_no, struct job_key *out);
/* The key job_format_error uses: by line when custom_id is NULL, e->code is
 * duplicate_custom_id or e->by_line, else by custom_id. */
void job_key_error(const char *custom_id, size_t len, const struct job_error *e, struct job_key *out);

/* ---- output lines ---------------------------------------------------------- */

/* The formatters append to a struct kvb_buf (base/buf.h); reuse it across
 * lines (set len = 0). On failure a formatter leaves len as it found it. */

enum job_finish {
    JOB_FINISH_STOP = 0, /* end-of-sequence token or a stop string */
    JOB_FINISH_LENGTH,   /* max_tokens or the context limit */
};

/* One alternative at a position. token points at the raw bytes of the
 * token's text, which may be a partial UTF-8 sequence: "bytes" carries them
 * exactly, "token" shows them with U+FFFD for what is not valid UTF-8.
 * logprob is natural log; -inf, NaN and values below -9999 are written as
 * -9999.0, as OpenAI does, because JSON has no infinity. */
struct job_top_logprob {
    const char *token;
    size_t token_len;
    float logprob;
};

/* The chosen token at one position, with its alternatives (n_top may be 0). */
struct job_token_logprob {
    const char *token;
    size_t token_len;
    float logprob;
    const struct job_top_logprob *top;
    size_t n_top;
    bool none; /* no score (an echoed prompt's first token): logprob and alternatives null */
};

/* One token of vLLM's prompt_logprobs entries: {"ID": {"logprob", "rank", "decoded_token"}}. */
struct job_rank_logprob {
    int32_t id;
    float logprob;
    int32_t rank;      /* 1 = most likely */
    const char *token; /* decoded */
    size_t token_len;
};

/* A prompt position's entries: the prompt token first, then the most likely
 * ones not already listed; n 0 (the first position): null. */
struct job_prompt_logprob {
    const struct job_rank_logprob *e;
    size_t n;
};

struct job_choice {
    const char *text; /* generated text, UTF-8 (invalid bytes are written as U+FFFD) */
    size_t text_len;
    enum job_finish finish;
    bool has_logprobs;                        /* false: "logprobs": null */
    const struct job_token_logprob *logprobs; /* one per generated token (echo: after the prompt's) */
    size_t n_logprobs;
    int64_t text_offset0; /* completions: code points before the first logprobs token (the prompt's,
                             when it is not echoed: OpenAI counts offsets from the prompt's start) */
    const struct job_prompt_logprob *prompt_logprobs; /* completions with prompt_logprobs: (n) one per
                                                         prompt token; NULL: not asked */
    size_t n_prompt_logprobs;
};

struct job_result {
    const char *custom_id;
    size_t custom_id_len;
    const char *custom_id_json; /* as written in the input (job_request.custom_id_json), or NULL:
                                       then custom_id is written escaped */
    size_t custom_id_json_len;
    enum job_url url;
    const char *model;              /* written as "model" (NUL-terminated) */
    const char *system_fingerprint; /* NULL: written as null */
    int64_t created;                /* unix seconds, passed in so tests can fix it */
    const struct job_choice *choices;
    size_t n_choices;
    int64_t prompt_tokens;
    int64_t completion_tokens;                        /* over all choices */
    int64_t cached_tokens;                            /* prompt tokens whose KV was reused */
    const struct job_prompt_logprob *prompt_logprobs; /* chat with prompt_logprobs: the body's own list
                                                         (vLLM's place for it); NULL: not asked */
    size_t n_prompt_logprobs;
};

/* Appends one success line ending in "\n":
 *   {"id":"batch_req_K","custom_id":…,"response":{"status_code":200,"request_id":"req_K",
 *    "body":{"id":"chatcmpl-K","object":"chat.completion","created":…,"model":…,
 *    "choices":[{"index":0,"message":{"role":"assistant","content":…},"logprobs":…,
 *    "finish_reason":"stop"}],"usage":{"prompt_tokens":…,"completion_tokens":…,
 *    "total_tokens":…,"prompt_tokens_details":{"cached_tokens":…}},
 *    "system_fingerprint":…}},"error":null}
 * Completions have "object":"text_completion", "id":"cmpl-K" and "text" in
 * place of "message". Chat logprobs: {"content":[{"token","logprob","bytes",
 * "top_logprobs":[{"token","logprob","bytes"}]}],"refusal":null}; completion
 * logprobs: {"tokens","token_logprobs","top_logprobs":[{token:logprob}],
 * "text_offset"}: offsets in code points (as Python's len counts them) from
 * the start of the prompt, as OpenAI counts them, a character split across
 * tokens counting where its first byte is. vLLM's prompt_logprobs: a list
 * with null first, then {"ID":{"logprob","rank","decoded_token"}} per prompt
 * token, in each completion choice and at the top of a chat body.
 * KVB_ERR_NOMEM on allocation failure. */
enum kvb_status job_format_result(struct kvb_buf *out, const struct job_result *r);

/* Appends one error line ending in "\n":
 *   {"id":"batch_req_K","custom_id":… or null,"response":{"status_code":400,
 *    "request_id":"req_K","body":{"error":{"message":…,"type":"invalid_request_error",
 *    "param":… or null,"code":…}}},"error":{"code":…,"message":…,"param":… or null,
 *    "line":N}}
 * (the last object has the fields of OpenAI's BatchError; line is the 1-based
 * input line, null when e->line_no is 0).
 * server_error lines have status 500 and type "server_error". custom_id may
 * be NULL. KVB_ERR_NOMEM on allocation failure. */
enum kvb_status job_format_error(struct kvb_buf *out, const char *custom_id, size_t custom_id_len,
                                 const struct job_error *e);
/* The same with the custom_id as written in the input (custom_id_json, see
 * job_request), echoed byte for byte; NULL: escaped from custom_id. */
enum kvb_status job_format_error_json(struct kvb_buf *out, const char *custom_id, size_t custom_id_len,
                                      const char *custom_id_json, size_t custom_id_json_len, const struct job_error *e);

/* ---- reading lines ---------------------------------------------------------- */

/* A streaming line reader. Memory is bounded by the longest line read (plus
 * a 64 KiB chunk), never by the file. Lines are yielded as they are: blank
 * ones included (see job_line_is_blank), "\r" of CRLF kept (JSON treats it as
 * whitespace); a last line without "\n" is yielded with terminated = false. */
struct job_reader;

struct job_line {
    const char *data;  /* valid until the next job_reader_next; not NUL-terminated */
    size_t len;        /* bytes held in data, without the "\n" */
    uint64_t full_len; /* bytes of the line in the stream, without the "\n" (> len when too_long) */
    uint64_t line_no;  /* 1-based */
    uint64_t offset;   /* byte offset of the line's first byte in the stream */
    bool terminated;   /* it ended in "\n" */
    bool too_long;     /* longer than max_line: data holds only the first max_line bytes,
                         the rest was skipped; the caller writes an error line */
};

/* f stays owned by the caller and is read from its current position (offsets
 * count from there). max_line 0 means JOB_MAX_LINE_DEFAULT. */
enum kvb_status job_reader_create(FILE *f, size_t max_line, struct job_reader **out, struct kvb_err *err);
/* Next line into *line and *got = true; at end of input *got = false.
 * KVB_ERR_IO on a read error, KVB_ERR_NOMEM when a line cannot be held,
 * KVB_ERR_CANCELLED when a handled signal interrupted a read (of a pipe). */
enum kvb_status job_reader_next(struct job_reader *r, struct job_line *line, bool *got, struct kvb_err *err);
void job_reader_free(struct job_reader *r); /* accepts NULL; does not close f */

/* True when the line holds only JSON whitespace (space, tab, CR, LF). */
bool job_line_is_blank(const char *s, size_t len);

/* ---- id sets ------------------------------------------------------------------ */

/* A set of byte strings (custom_ids, keys): open addressing over xxh3 hashes,
 * strings copied into chunked storage. Memory is proportional to the number
 * and size of ids. Used for duplicate custom_id detection and for resume. */
struct job_idset;

enum kvb_status job_idset_create(struct job_idset **out);
void job_idset_free(struct job_idset *s); /* accepts NULL */
/* Adds id; *added (may be NULL) says whether it was new. KVB_ERR_NOMEM leaves
 * the set as it was. */
enum kvb_status job_idset_add(struct job_idset *s, const char *id, size_t len, bool *added);
bool job_idset_contains(const struct job_idset *s, const char *id, size_t len);
size_t job_idset_count(const struct job_idset *s);

/* ---- resume ---------------------------------------------------------------- */

struct job_resume_info {
    uint64_t lines_ok;       /* complete, valid lines whose key went into the set */
    uint64_t lines_bad;      /* complete lines in the middle that are not valid output lines */
    uint64_t first_bad_line; /* 1-based line number of the first of those; 0 when none */
    bool torn;               /* the file ends in bad or unterminated bytes */
    uint64_t truncate_at;    /* byte offset just past the last valid line: truncate
                                the file here before appending (== size when !torn) */
    uint64_t size;           /* bytes in the file */
};

/* Scans an output file written by job_format_* and adds the key (the hex
 * after "batch_req_" in "id") of every complete, valid line to keys. A line
 * is valid when it ends in "\n", is a JSON object and has such an "id".
 * Invalid lines at the end (a line cut off by a kill, a tail of zero bytes
 * after a crash) make the file torn: truncate it at info->truncate_at. Invalid
 * lines in the middle are counted, not dropped, because every valid line
 * after them is a result that need not be recomputed. The caller then skips
 * an input line when its key (job_key_custom_id / job_key_error) is in keys.
 * A missing file is an empty one (KVB_OK). KVB_ERR_IO, KVB_ERR_NOMEM. */
enum kvb_status job_resume_scan(const char *path, struct job_idset *keys, struct job_resume_info *info,
                                struct kvb_err *err);

#endif
