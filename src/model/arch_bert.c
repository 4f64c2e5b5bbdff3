/* arch_bert.c — "bert": BERT encoders (bge, e5, MiniLM, sentence-
 * transformers' all-*), and BertForSequenceClassification cross-encoders,
 * as llama.cpp's converter writes them (conversion/bert.py).
 *
 * Not the llama layer (model_ops.encoder): the input is the sum of the
 * token's, its position's and its token type's embeddings, LayerNormed;
 * each layer is attention over the whole sequence (no mask, no RoPE),
 * with biases, its output added to the input and LayerNormed; then an
 * ungated FFN, GELU (erf) between up and down, biases, added and
 * LayerNormed. The last layer's output is the hidden state pooling reads
 * (no final norm, no LM head). `bert.attention.causal` must say false.
 *
 * Token types: the converter writes `tokenizer.ggml.token_type_count` and
 * the types' embedding; the token type of a position is 1 after the
 * sequence's first separator token ([SEP]: a pair's second text, as a
 * BERT tokenizer's pair encoding marks it), 0 before — where llama.cpp
 * feeds type 0 everywhere, transformers' cross-encoders read the types.
 *
 * A cross-encoder's head: the converter renames BertForSequenceClassification's
 * classifier to cls.output and drops the pooler (its dense layer and tanh,
 * which transformers applies first); a file that keeps the pooler as
 * cls.weight/cls.bias gets transformers' scores, one without gets
 * llama.cpp's (model.h, pool_rank_logit). */
#include <stdio.h>
#include <string.h>

#include "model/arch.h"
#include "model/model_internal.h"

static const char *const bert_keys[] = {"attention.causal", NULL};

static enum kvb_status bert_read(struct model *m, struct kvb_err *err)
{
    char key[128];
    bool causal = true;
    if (gguf_get_bool(m->gguf, model_key(m, "attention.causal", key, sizeof key), &causal, NULL) != KVB_OK || causal)
        return kvb_errf(err, KVB_ERR_UNSUPPORTED,
                        "model key '%s' is %s: kvbatch computes bert as an encoder (bidirectional attention)", key,
                        gguf_find(m->gguf, key) ? "true" : "missing");
    uint32_t v;
    m->enc.n_types = gguf_get_u32(m->gguf, "tokenizer.ggml.token_type_count", &v, NULL) == KVB_OK ? (int32_t)v : 1;
    m->enc.sep_token = gguf_get_u32(m->gguf, "tokenizer.ggml.seperator_token_id", &v, NULL) == KVB_OK ? (int32_t)v : -1;
    if (m->enc.n_types < 1 || m->enc.n_types > 16)
        return kvb_errf(err, KVB_ERR_FORMAT, "model key 'tokenizer.ggml.token_type_count' = %d is implausible",
                        m->enc.n_types);
    if (!(m->enc.ln_eps >= 0))
        return kvb_errf(err, KVB_ERR_FORMAT, "model key '%s' must be a non-negative number",
                        model_key(m, "attention.layer_norm_epsilon", key, sizeof key));
    if (m->hp.n_head_kv != m->hp.n_head)
        return kvb_errf(err, KVB_ERR_FORMAT, "bert has as many key/value heads as query heads (%d, not %d)",
                        m->hp.n_head, m->hp.n_head_kv);
    return KVB_OK;
}

static enum kvb_status bert_bind(struct model *m, struct kvb_err *err)
{
    const struct model_hparams *hp = &m->hp;
    struct model_encoder *enc = &m->enc;
    const int64_t e = hp->n_embd, q = (int64_t)hp->n_head * hp->head_dim;
    if (q != e)
        return kvb_errf(err, KVB_ERR_FORMAT, "bert's heads (%d x %d) must make its width %d", hp->n_head, hp->head_dim,
                        hp->n_embd);
    KVB_FORWARD_IF_ERROR(model_bind_matrix(m, "token_embd.weight", e, hp->n_vocab, true, &m->tok_embd, err));
    enc->n_pos = hp->n_ctx_train;
    KVB_FORWARD_IF_ERROR(model_bind_matrix(m, "position_embd.weight", e, enc->n_pos, true, &enc->pos_embd, err));
    if (enc->n_types > 0)
        KVB_FORWARD_IF_ERROR(model_bind_matrix(m, "token_types.weight", e, enc->n_types, false, &enc->type_embd, err));
    KVB_FORWARD_IF_ERROR(model_bind_vector(m, "token_embd_norm.weight", e, true, &enc->embd_norm, err));
    KVB_FORWARD_IF_ERROR(model_bind_vector(m, "token_embd_norm.bias", e, true, &enc->embd_norm_b, err));
    for (int l = 0; l < hp->n_layer; l++) {
        struct model_layer *L = &m->layers[l];
        char nm[96];
#define NAME(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
        KVB_FORWARD_IF_ERROR(model_bind_matrix(m, NAME("attn_q.weight"), e, q, true, &L->wq, err));
        KVB_FORWARD_IF_ERROR(model_bind_matrix(m, NAME("attn_k.weight"), e, q, true, &L->wk, err));
        KVB_FORWARD_IF_ERROR(model_bind_matrix(m, NAME("attn_v.weight"), e, q, true, &L->wv, err));
        KVB_FORWARD_IF_ERROR(model_bind_vector(m, NAME("attn_q.bias"), q, true, &L->bq, err));
        KVB_FORWARD_IF_ERROR(model_bind_vector(m, NAME("attn_k.bias"), q, true, &L->bk, err));
        KVB_FORWARD_IF_ERROR(model_bind_vector(m, NAME("attn_v.bias"), q, true, &L->bv, err));
        KVB_FORWARD_IF_ERROR(model_bind_matrix(m, NAME("attn_output.weight"), q, e, true, &L->wo, err));
        KVB_FORWARD_IF_ERROR(model_bind_vector(m, NAME("attn_output.bias"), e, true, &L->bo, err));
        KVB_FORWARD_IF_ERROR(model_bind_vector(m, NAME("attn_output_norm.weight"), e, true, &L->ln_attn, err));
        KVB_FORWARD_IF_ERROR(model_bind_vector(m, NAME("attn_output_norm.bias"), e, true, &L->ln_attn_b, err));
        KVB_FORWARD_IF_ERROR(model_bind_matrix(m, NAME("ffn_up.weight"), e, hp->n_ff, true, &L->w_up, err));
        KVB_FORWARD_IF_ERROR(model_bind_vector(m, NAME("ffn_up.bias"), hp->n_ff, true, &L->b_up, err));
        KVB_FORWARD_IF_ERROR(model_bind_matrix(m, NAME("ffn_down.weight"), hp->n_ff, e, true, &L->w_down, err));
        KVB_FORWARD_IF_ERROR(model_bind_vector(m, NAME("ffn_down.bias"), e, true, &L->b_down, err));
        KVB_FORWARD_IF_ERROR(model_bind_vector(m, NAME("layer_output_norm.weight"), e, true, &L->ln_out, err));
        KVB_FORWARD_IF_ERROR(model_bind_vector(m, NAME("layer_output_norm.bias"), e, true, &L->ln_out_b, err));
#undef NAME
    }
    return KVB_OK;
}

const struct arch_desc arch_bert = {
    .name = "bert",
    .rope = ROPE_NORM, /* unused: no RoPE */
    .act = MODEL_ACT_GELU_ERF,
    .keys = bert_keys,
    .read = bert_read,
    .encoder = true,
    .bind = bert_bind,
};
