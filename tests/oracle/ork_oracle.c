/* ork_oracle.c - llama.cpp as a test oracle: tokens and exact float logits.
 *
 * Built by .ci/llama-oracle against the llama.cpp vendored in the
 * llama-cpp-python sdist (static libraries); the tests call it through
 * tests/oracle.py. Two commands, binary little-endian files:
 *
 *   ork-oracle tokenize MODEL TEXT OUT
 *       TEXT's bytes tokenized as llama-perplexity tokenizes text
 *       (add_special = true, parse_special = false) -> OUT: int32 ids.
 *   ork-oracle logits MODEL TOKENS N_CTX FIRST THREADS OUT
 *       TOKENS (int32) cut into chunks of N_CTX; each chunk is decoded from an
 *       empty cache in one batch; rows FIRST..N_CTX-1 of every chunk ->
 *       OUT: float32 (n_chunk, N_CTX - FIRST, n_vocab). KV cache float32 and
 *       flash attention off, so the oracle's arithmetic is float32 throughout.
 *   ork-oracle greedy MODEL TOKENS N_PREDICT THREADS OUT
 *       TOKENS (int32, the prompt) decoded in one batch, then up to N_PREDICT
 *       tokens generated greedily (the first largest logit), each fed back
 *       alone through the KV cache (float32, flash attention off), stopping
 *       before an end-of-generation token -> OUT: int32 ids. stderr: one line
 *       "timing: prompt N_PROMPT MS ms, decode N tokens MS ms" (decode: the
 *       one-token steps after the prompt's batch).
 *
 * Exit status 0 on success; errors go to stderr with status 1.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static int die(const char *msg, const char *arg) {
    fprintf(stderr, "ork-oracle: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    return 1;
}

static char *slurp(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)*len + 1);
    if (buf && fread(buf, 1, (size_t)*len, f) != (size_t)*len) { free(buf); buf = NULL; }
    fclose(f);
    return buf;
}

static bool no_progress(float progress, void *ud) {
    (void)progress;
    (void)ud;
    return true;
}

static struct llama_model *load(const char *path, int vocab_only) {
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = vocab_only;
    mp.progress_callback = no_progress;
    return llama_model_load_from_file(path, mp);
}

static int cmd_tokenize(const char *model_path, const char *text_path, const char *out_path) {
    struct llama_model *model = load(model_path, 1);
    if (!model) return die("cannot load model", model_path);
    long len = 0;
    char *text = slurp(text_path, &len);
    if (!text) return die("cannot read", text_path);
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int32_t cap = (int32_t)len + 16;
    llama_token *ids = malloc(sizeof(llama_token) * (size_t)cap);
    int32_t n = llama_tokenize(vocab, text, (int32_t)len, ids, cap, 1, 0);
    if (n < 0) return die("tokenize failed", NULL);
    FILE *f = fopen(out_path, "wb");
    if (!f || fwrite(ids, sizeof(llama_token), (size_t)n, f) != (size_t)n || fclose(f)) return die("cannot write", out_path);
    free(ids);
    free(text);
    llama_model_free(model);
    return 0;
}

static int cmd_logits(const char *model_path, const char *tok_path, int n_ctx, int first, int threads, const char *out_path) {
    long len = 0;
    char *raw = slurp(tok_path, &len);
    if (!raw) return die("cannot read", tok_path);
    const llama_token *toks = (const llama_token *)raw;
    long n_tok = len / (long)sizeof(llama_token);
    if (n_ctx <= 0 || first < 0 || first >= n_ctx || n_tok < n_ctx) return die("bad n_ctx / first / token count", NULL);
    struct llama_model *model = load(model_path, 0);
    if (!model) return die("cannot load model", model_path);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = (uint32_t)n_ctx;
    cp.n_ubatch = (uint32_t)n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.swa_full = 1;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return die("cannot create context", NULL);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE *f = fopen(out_path, "wb");
    if (!f) return die("cannot write", out_path);
    struct llama_batch batch = llama_batch_init(n_ctx, 0, 1);
    for (long c = 0; c + n_ctx <= n_tok; c += n_ctx) {
        llama_memory_clear(llama_get_memory(ctx), 1);
        batch.n_tokens = n_ctx;
        for (int i = 0; i < n_ctx; i++) {
            batch.token[i] = toks[c + i];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = i >= first;
        }
        if (llama_decode(ctx, batch)) return die("llama_decode failed", NULL);
        for (int i = first; i < n_ctx; i++)
            if (fwrite(llama_get_logits_ith(ctx, i), sizeof(float), (size_t)n_vocab, f) != (size_t)n_vocab)
                return die("cannot write", out_path);
    }
    if (fclose(f)) return die("cannot write", out_path);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    free(raw);
    return 0;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmd_greedy(const char *model_path, const char *tok_path, int n_predict, int threads, const char *out_path) {
    long len = 0;
    char *raw = slurp(tok_path, &len);
    if (!raw) return die("cannot read", tok_path);
    const llama_token *toks = (const llama_token *)raw;
    const int n_prompt = (int)(len / (long)sizeof(llama_token));
    if (n_prompt < 1 || n_predict < 0) return die("bad prompt / n_predict", NULL);
    struct llama_model *model = load(model_path, 0);
    if (!model) return die("cannot load model", model_path);
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_prompt + n_predict + 1);
    cp.n_batch = (uint32_t)n_prompt;
    cp.n_ubatch = (uint32_t)n_prompt;
    cp.n_seq_max = 1;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.swa_full = 1;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return die("cannot create context", NULL);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    llama_token *out = malloc(sizeof(llama_token) * (size_t)(n_predict + 1));
    struct llama_batch batch = llama_batch_get_one((llama_token *)toks, n_prompt);
    int n_out = 0, n_dec = -1; /* decode calls after the prompt's */
    double t0 = now_ms(), t_prompt = 0.0, t1 = 0.0;
    for (;;) {
        if (llama_decode(ctx, batch)) return die("llama_decode failed", NULL);
        if (++n_dec == 0) {
            t_prompt = now_ms() - t0;
            t1 = now_ms();
        }
        if (n_out == n_predict) break;
        const float *l = llama_get_logits_ith(ctx, -1);
        llama_token best = 0;
        for (int i = 1; i < n_vocab; i++)
            if (l[i] > l[best]) best = i;
        if (llama_vocab_is_eog(vocab, best)) break;
        out[n_out++] = best;
        if (n_out == n_predict) break;
        batch = llama_batch_get_one(&out[n_out - 1], 1);
    }
    fprintf(stderr, "timing: prompt %d %.3f ms, decode %d tokens %.3f ms\n", n_prompt, t_prompt, n_dec,
            n_dec ? now_ms() - t1 : 0.0);
    FILE *f = fopen(out_path, "wb");
    if (!f || fwrite(out, sizeof(llama_token), (size_t)n_out, f) != (size_t)n_out || fclose(f))
        return die("cannot write", out_path);
    free(out);
    llama_free(ctx);
    llama_model_free(model);
    free(raw);
    return 0;
}

int main(int argc, char **argv) {
    llama_log_set(quiet, NULL);
    llama_backend_init();
    int rc;
    if (argc == 5 && !strcmp(argv[1], "tokenize"))
        rc = cmd_tokenize(argv[2], argv[3], argv[4]);
    else if (argc == 8 && !strcmp(argv[1], "logits"))
        rc = cmd_logits(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), argv[7]);
    else if (argc == 7 && !strcmp(argv[1], "greedy"))
        rc = cmd_greedy(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), argv[6]);
    else
        rc = die("usage: ork-oracle tokenize MODEL TEXT OUT | logits MODEL TOKENS N_CTX FIRST THREADS OUT | "
                 "greedy MODEL TOKENS N_PREDICT THREADS OUT", NULL);
    llama_backend_free();
    return rc;
}
