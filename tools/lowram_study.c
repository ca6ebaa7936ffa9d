/* LowRAM measurements (docs/LOWRAM.md): ΔNLL and KL of a teacher-forced continuation
 * after a compressed prompt, against exact f16 KV in the same run; KV bytes by part;
 * decode tokens/s; fit statistics (rank, key energy lost, value R²).
 *
 *   lowram_study [-m MODEL] -f TEXT [--prompt 2048] [--cont 256] [--skip 0] [-t 2]
 *                [--kv SPEC]... [--r2] [--json]
 * SPEC is the part after "lowram:" of --kv ("" for the defaults; "kv=q8": a plain q8 cache). Each SPEC runs on its
 * own session after one exact run. --r2 prints the per-layer/head R² table of the first.
 * --reuse: each SPEC that needed a prefill exports its state after the prompt (up to 8), and
 * a later SPEC with the same stored-state parameters (decode knobs only differ) imports it,
 * so a sweep over budget / topp / dl0,dl1 ... pays one LowRAM prefill per fit setting. */
#include <math.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rk_ext.h"
#include "rk_fitters.h"
#include "tb.h"

typedef struct run_out {
    double nll, kl, top1, dec_s, dec_cpu_s, pf_s; /* dec_cpu_s: process CPU time per step */
    double kl_max;                                /* the largest per-step KL */
    bool reused;                                  /* --reuse: the prompt's state was imported (pf_s: the import) */
    rk_kv_bytes kb;
    rk_lowram_stats ls; /* value_r2 and sel_miss: NULL, copied into r2 and miss */
    float r2[1024][64]; /* (layer, KV head) the predictors' R², copied before the session goes */
    float miss[1024];
} run_out;

static double *g_ref_lp; /* (cont, n_vocab) exact log-probs */
static int g_slices;     /* prompt eval slice (0: one call) */
/* --reuse: LowRAM states after the prompt (and the prompt's last logits); a later SPEC whose
 * stored-state parameters match one imports it instead of a prefill of its own (decode-only
 * knobs: budget, topp, minch, krank, dense, dl0/dl1, nosumm, nocache, ...) */
static bool g_reuse;
enum { MAX_BLK = 8 };
static void *g_blk[MAX_BLK];
static size_t g_blk_n[MAX_BLK];
static float *g_blk_lg[MAX_BLK];
static int g_n_blk;

/* Resident set now, from /proc/self/statm (MiB). */
static double rss_now_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, res = 0;
    if (!f) return 0;
    if (fscanf(f, "%llu %llu", &size, &res) != 2) res = 0;
    fclose(f);
    return (double)res * 4096.0 / 1048576.0;
}
static int32_t *g_ref_top; /* (cont) */

/* CPU time of the whole process (every thread), seconds: on a shared machine this is the
 * work a step costs, where wall time also counts the waits for a core. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void log_softmax(const float *lg, int n, double *out) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) mx = lg[i] > mx ? lg[i] : mx;
    for (int i = 0; i < n; i++) s += exp(lg[i] - mx);
    const double ls = mx + log(s);
    for (int i = 0; i < n; i++) out[i] = lg[i] - ls;
}

static bool g_r2cmp; /* value-from-key R² of simple predictors on the exact prompt cache */

/* In-sample R² per (layer, KV head) of ridge predictors of V_h from the exact pre-RoPE keys:
 * (a) the head's own d_h dims (SPEC's d_h x d_h start), (b) all KV heads of the layer. */
static void r2_compare(const rk_model *m, rk_session *s, int n) {
    const rk_hparams *hp = rk_model_hparams(m);
    const int hd = hp->head_dim, kvd = hp->n_head_kv * hd, sink = 4;
    const int64_t N = n - sink;
    double *K = malloc((size_t)N * kvd * sizeof(double)), *V = malloc((size_t)N * kvd * sizeof(double));
    double *Kh = malloc((size_t)N * hd * sizeof(double)), *Vh = malloc((size_t)N * hd * sizeof(double));
    double *W = malloc((size_t)kvd * hd * sizeof(double)), b[512];
    double *Wl = malloc((size_t)kvd * kvd * sizeof(double)), *bl = malloc((size_t)kvd * sizeof(double));
    float *row = malloc((size_t)kvd * sizeof(float));
    double sum_a = 0, sum_b = 0;
    printf(
        "value R² (in-sample, %lld rows) per layer, mean over KV heads: own head keys (d_h) / all layer keys (kv_dim)\n",
        (long long)N);
    for (int l = 0; l < hp->n_layer; l++) {
        for (int64_t p = 0; p < N; p++) {
            if (rk_session_kv_rows(s, l, false, true, sink + p, 1, row, NULL)) return;
            for (int j = 0; j < kvd; j++) K[p * kvd + j] = row[j];
            if (rk_session_kv_rows(s, l, true, false, sink + p, 1, row, NULL)) return;
            for (int j = 0; j < kvd; j++) V[p * kvd + j] = row[j];
        }
        double ra = 0, rb = 0;
        /* (b): all of V from all of K in one fit (the solve is separable per output column) */
        const bool fb = rk_ridge_fit_rows(kvd, kvd, N, K, V, 1e-3, Wl, bl);
        for (int h = 0; h < hp->n_head_kv; h++) {
            for (int64_t p = 0; p < N; p++)
                for (int j = 0; j < hd; j++)
                    Kh[p * hd + j] = K[p * kvd + h * hd + j], Vh[p * hd + j] = V[p * kvd + h * hd + j];
            for (int pass = 0; pass < 2; pass++) {
                const int din = pass ? kvd : hd, ldw = pass ? kvd : hd, col = pass ? h * hd : 0;
                const double *X = pass ? K : Kh, *Wp = pass ? Wl : W, *bp = pass ? bl + h * hd : b;
                if (pass ? !fb : !rk_ridge_fit_rows(din, hd, N, X, Vh, 1e-3, W, b)) continue;
                double sse = 0, sst = 0, mu[512] = {0};
                for (int64_t p = 0; p < N; p++)
                    for (int j = 0; j < hd; j++) mu[j] += Vh[p * hd + j] / (double)N;
                for (int64_t p = 0; p < N; p++)
                    for (int j = 0; j < hd; j++) {
                        double y = bp[j];
                        for (int i = 0; i < din; i++) y += X[p * din + i] * Wp[(size_t)i * ldw + col + j];
                        sse += (Vh[p * hd + j] - y) * (Vh[p * hd + j] - y);
                        sst += (Vh[p * hd + j] - mu[j]) * (Vh[p * hd + j] - mu[j]);
                    }
                *(pass ? &rb : &ra) += 1.0 - sse / sst;
            }
        }
        ra /= hp->n_head_kv, rb /= hp->n_head_kv;
        sum_a += ra, sum_b += rb;
        printf("%s%2d: %.2f/%.2f", l % 6 ? "  " : "\n    ", l, ra, rb);
    }
    printf("\n    mean: own head %.3f, all layer keys %.3f\n", sum_a / hp->n_layer, sum_b / hp->n_layer);
    free(K), free(V), free(Kh), free(Vh), free(W), free(Wl), free(bl), free(row);
}

static int run(const rk_model *m, const int32_t *ids, int n_prompt, int n_cont, int n_threads, const char *spec,
               bool reference, run_out *o) {
    const rk_hparams *hp = rk_model_hparams(m);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = n_prompt + n_cont + 1;
    sp.n_threads = n_threads;
    rk_session *s = NULL;
    rk_err e = {0};
    float *lg = malloc((size_t)hp->n_vocab * sizeof(float));
    double *lp = malloc((size_t)hp->n_vocab * sizeof(double));
    /* "kv=q8" / "kv=f32": a plain cache of that type instead of LowRAM (the comparison at
     * equal bytes) */
    if (spec && !strncmp(spec, "kv=", 3)) {
        if (rk_kv_params_parse(spec + 3, &sp.kv, &e)) goto fail;
    } else if (spec) {
        sp.kv.kind = RK_KV_LOWRAM;
        sp.kv.lowram.n_threads = n_threads;
        if (rk_lowram_parse(spec, &sp.kv.lowram, &e)) goto fail;
    }
    if (rk_session_create(m, &sp, &s, &e)) goto fail;
    double t0 = rk_time_now();
    int done = 0;
    o->reused = false;
    const bool lowram = spec && strncmp(spec, "kv=", 3);
    for (int k = 0; lowram && k < g_n_blk && !o->reused; k++) /* a failed import leaves the session unchanged */
        if (rk_session_kv_import(s, g_blk[k], g_blk_n[k], &e) == RK_OK) {
            memcpy(lg, g_blk_lg[k], (size_t)hp->n_vocab * sizeof(float));
            done = n_prompt, o->reused = true;
        }
    for (; done < n_prompt;) { /* --slices: the prompt in several eval calls */
        int n = g_slices > 0 && n_prompt - done > g_slices ? g_slices : n_prompt - done;
        if (rk_session_eval(s, ids + done, (size_t)n, lg, false, &e)) goto fail;
        done += n;
    }
    double t1 = rk_time_now(), c1 = cpu_now();
    if (lowram && g_reuse && !o->reused && g_n_blk < MAX_BLK) {
        const int k = g_n_blk++;
        if (rk_session_kv_export(s, 0, n_prompt, &g_blk[k], &g_blk_n[k], &e)) goto fail;
        g_blk_lg[k] = malloc((size_t)hp->n_vocab * sizeof(float));
        memcpy(g_blk_lg[k], lg, (size_t)hp->n_vocab * sizeof(float));
    }
    if (g_r2cmp && !spec) {
        r2_compare(m, s, n_prompt);
        g_r2cmp = false;
    }
    const bool reused = o->reused;
    memset(o, 0, sizeof *o);
    o->reused = reused;
    for (int i = 0; i < n_cont; i++) {
        log_softmax(lg, hp->n_vocab, lp);
        const int32_t next = ids[n_prompt + i];
        int top = 0;
        for (int v = 1; v < hp->n_vocab; v++) top = lp[v] > lp[top] ? v : top;
        if (reference) {
            memcpy(g_ref_lp + (size_t)i * hp->n_vocab, lp, (size_t)hp->n_vocab * sizeof(double));
            g_ref_top[i] = top;
        } else {
            const double *rp = g_ref_lp + (size_t)i * hp->n_vocab;
            double kl = 0;
            for (int v = 0; v < hp->n_vocab; v++) kl += exp(rp[v]) * (rp[v] - lp[v]);
            o->kl += kl;
            o->kl_max = kl > o->kl_max ? kl : o->kl_max;
            o->top1 += top == g_ref_top[i];
        }
        o->nll -= lp[next];
        if (i + 1 < n_cont && rk_session_eval(s, &ids[n_prompt + i], 1, lg, false, &e)) goto fail;
    }
    double t2 = rk_time_now(), c2 = cpu_now();
    o->nll /= n_cont, o->kl /= n_cont, o->top1 /= n_cont;
    o->pf_s = t1 - t0, o->dec_s = (t2 - t1) / (n_cont > 1 ? n_cont - 1 : 1);
    o->dec_cpu_s = (c2 - c1) / (n_cont > 1 ? n_cont - 1 : 1);
    rk_session_kv_bytes(s, &o->kb);
    rk_session_lowram_stats(s, &o->ls);
    for (int l = 0; l < o->ls.n_layer && l < 1024; l++) {
        for (int h = 0; o->ls.value_r2 && h < o->ls.n_head_kv && h < 64; h++)
            o->r2[l][h] = o->ls.value_r2[(size_t)l * o->ls.n_head_kv + h];
        o->miss[l] = o->ls.sel_miss ? o->ls.sel_miss[l] : -1.0f;
    }
    o->ls.value_r2 = NULL, o->ls.sel_miss = NULL; /* borrowed from s: gone with it */
    rk_session_destroy(s);
    free(lg), free(lp);
    return 0;
fail:
    fprintf(stderr, "lowram_study: %s\n", e.msg);
    rk_session_destroy(s);
    free(lg), free(lp);
    return 1;
}

/* Passkey retrieval: filler text with "The pass key is NNNNN. Remember it. NNNNN is the
 * pass key." at a depth, then "What is the pass key? The pass key is"; greedy decode of 8
 * tokens must contain the digits. Returns 1 when found, 0 when not, -1 on error. */
static int needle_trial(const rk_model *m, const int32_t *filler, int n_fill, double depth, unsigned key, int n_threads,
                        const char *spec) {
    const rk_hparams *hp = rk_model_hparams(m);
    char needle[160], ask[] = "\nWhat is the pass key? The pass key is";
    snprintf(needle, sizeof needle, " The pass key is %u. Remember it. %u is the pass key. ", key, key);
    int32_t *nd = NULL, *aq = NULL;
    size_t n_nd, n_aq;
    rk_err e = {0};
    if (rk_model_tokenize(m, needle, strlen(needle), false, false, &nd, &n_nd, &e) ||
        rk_model_tokenize(m, ask, strlen(ask), false, false, &aq, &n_aq, &e))
        return -1;
    const int at = 1 + (int)(depth * (n_fill - 1));
    const size_t n = (size_t)n_fill + n_nd + n_aq;
    int32_t *ids = malloc((n + 8) * sizeof(int32_t));
    memcpy(ids, filler, (size_t)at * sizeof(int32_t));
    memcpy(ids + at, nd, n_nd * sizeof(int32_t));
    memcpy(ids + at + n_nd, filler + at, (size_t)(n_fill - at) * sizeof(int32_t));
    memcpy(ids + n_fill + n_nd, aq, n_aq * sizeof(int32_t));
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = (int32_t)n + 16;
    sp.n_threads = n_threads;
    rk_session *s = NULL;
    float *lg = malloc((size_t)hp->n_vocab * sizeof(float));
    char out[256] = "", want[16];
    int found = -1;
    if (spec) {
        sp.kv.kind = RK_KV_LOWRAM;
        sp.kv.lowram.n_threads = n_threads;
        if (rk_lowram_parse(spec, &sp.kv.lowram, &e)) goto done;
    }
    if (rk_session_create(m, &sp, &s, &e)) goto done;
    if (rk_session_eval(s, ids, n, lg, false, &e)) goto done;
    size_t ol = 0;
    for (int t = 0; t < 8; t++) {
        int32_t best = 0;
        for (int v = 1; v < hp->n_vocab; v++) best = lg[v] > lg[best] ? v : best;
        char piece[64];
        size_t pl = rk_model_token_piece(m, best, false, piece, sizeof piece);
        if (pl < sizeof piece && ol + pl < sizeof out - 1) memcpy(out + ol, piece, pl), ol += pl, out[ol] = 0;
        if (rk_session_eval(s, &best, 1, lg, false, &e)) goto done;
    }
    snprintf(want, sizeof want, "%u", key);
    found = strstr(out, want) != NULL;
done:
    if (found < 0) fprintf(stderr, "needle: %s\n", e.msg);
    rk_session_destroy(s);
    free(lg), free(ids), free(nd), free(aq);
    return found;
}

int main(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *specs[32];
    int n_specs = 0, n_prompt = 2048, n_cont = 256, skip = 0, n_threads = 2;
    bool r2 = false, json = false;
#ifdef __GLIBC__
    /* as ridgekv (cli/main.c): a fixed mmap threshold, so the --rss peaks are the CLI's */
    if (!getenv("MALLOC_MMAP_THRESHOLD_")) (void)mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
    int needle = 0;   /* trials per depth */
    bool rss = false; /* --rss: one session (the first --kv, or exact f16 with --kv f16), peak RSS */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "-m")) model = v, i++;
        else if (!strcmp(a, "-f")) text = v, i++;
        else if (!strcmp(a, "--prompt")) n_prompt = atoi(v), i++;
        else if (!strcmp(a, "--cont")) n_cont = atoi(v), i++;
        else if (!strcmp(a, "--skip")) skip = atoi(v), i++;
        else if (!strcmp(a, "-t")) n_threads = atoi(v), i++;
        else if (!strcmp(a, "--kv") && n_specs < 32) specs[n_specs++] = v, i++;
        else if (!strcmp(a, "--r2")) r2 = true;
        else if (!strcmp(a, "--needle")) needle = atoi(v), i++;
        else if (!strcmp(a, "--slices")) g_slices = atoi(v), i++;
        else if (!strcmp(a, "--rss")) rss = true;
        else if (!strcmp(a, "--r2cmp")) g_r2cmp = true;
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--reuse")) g_reuse = true;
        else {
            fprintf(stderr, "lowram_study: unknown argument '%s'\n", a);
            return 2;
        }
    }
    char mb[1024];
    if (!model) model = tb_default_model(mb, sizeof mb);
    if (!model || !text || n_prompt < 1 || n_cont < 1) {
        fprintf(stderr,
                "usage: lowram_study [-m MODEL] -f TEXT [--prompt N] [--cont M] [--skip K] [-t T] [--kv SPEC]...\n");
        return 2;
    }
    if (!n_specs) specs[n_specs++] = "";
    rk_model *m = NULL;
    rk_err e = {0};
    if (rk_model_load(model, &m, &e)) {
        fprintf(stderr, "lowram_study: %s\n", e.msg);
        return 1;
    }
    const rk_hparams *hp = rk_model_hparams(m);
    size_t len, n_ids;
    char *txt = tb_read_file(text, &len);
    int32_t *ids = NULL;
    if (!txt || rk_model_tokenize(m, txt, len, true, false, &ids, &n_ids, &e)) {
        fprintf(stderr, "lowram_study: cannot read/tokenize %s %s\n", text, e.msg);
        return 1;
    }
    free(txt);
    if (n_ids < (size_t)(skip + n_prompt + n_cont)) {
        fprintf(stderr, "lowram_study: %s has %zu tokens, need %d\n", text, n_ids, skip + n_prompt + n_cont);
        return 1;
    }
    int32_t *w = ids + skip;
    if (skip > 0) w[0] = rk_model_token_bos(m);
    if (needle > 0) {
        /* depths 0.1 .. 0.7 (inside the compressed rows for prompts >> window), keys fixed */
        const double depths[] = {0.1, 0.3, 0.5, 0.7};
        printf("passkey retrieval, %d filler tokens, %d trials per depth (depths 0.1 0.3 0.5 0.7)\n", n_prompt, needle);
        for (int k = -1; k < n_specs; k++) {
            int hit = 0, tot = 0;
            char res[64] = "";
            for (int d = 0; d < 4; d++)
                for (int t = 0; t < needle; t++) {
                    unsigned key = 10000u + (unsigned)((d * 7919 + t * 104729) % 89999);
                    int f = needle_trial(m, w, n_prompt, depths[d], key, n_threads, k < 0 ? NULL : specs[k]);
                    if (f < 0) return 1;
                    hit += f, tot++;
                    strncat(res, f ? "1" : "0", sizeof res - strlen(res) - 1);
                }
            printf("%-44s %d/%d  %s\n", k < 0 ? "f16 exact" : specs[k], hit, tot, res);
            fflush(stdout);
        }
        free(ids);
        rk_model_destroy(m);
        return 0;
    }
    g_ref_lp = malloc((size_t)n_cont * hp->n_vocab * sizeof(double));
    g_ref_top = malloc((size_t)n_cont * sizeof(int32_t));
    if (rss) {
        /* memory of one configuration in this process: no exact reference run first */
        run_out r;
        const bool exact = !strcmp(specs[0], "f16");
        if (run(m, w, n_prompt, n_cont, n_threads, exact ? NULL : specs[0], true, &r)) return 1;
        printf("%s, prompt %d in slices of %d: peak RSS %.1f MiB, RSS after %.1f MiB, KV total %.1f MiB "
               "(f16 %.1f MiB), NLL %.4f, prefill %.1f s, decode %.1f ms/token\n",
               exact ? "f16 exact" : specs[0], n_prompt, g_slices ? g_slices : n_prompt,
               (double)rk_peak_rss_bytes() / 1048576.0, rss_now_mib(), (double)r.kb.total / 1048576.0,
               (double)r.kb.f16_equiv / 1048576.0, r.nll, r.pf_s, 1000 * r.dec_s);
        return 0;
    }
    run_out ref, o;
    if (run(m, w, n_prompt, n_cont, n_threads, NULL, true, &ref)) return 1;
    printf("model %s, prompt %d tokens (+%d skipped), continuation %d, threads %d\n", rk_model_name(m), n_prompt, skip,
           n_cont, n_threads);
    printf("%-44s %8s %8s %8s %7s %9s %8s %8s %8s %7s %7s %9s %8s %7s\n", "kv", "NLL", "dNLL", "KL", "top1", "B/tok",
           "ratio", "ratio_c", "dec_ms", "fit_s", "pf_s", "cpu_ms", "rebuilt", "KLmax");
    printf("%-44s %8.4f %8s %8s %7s %9.0f %8s %8s %8.1f %7s %7.2f %9.1f\n", "f16 exact", ref.nll, "", "", "",
           (double)ref.kb.total / ref.kb.n_tokens, "1.00", "", 1000 * ref.dec_s, "", ref.pf_s, 1000 * ref.dec_cpu_s);
    for (int k = 0; k < n_specs; k++) {
        if (run(m, w, n_prompt, n_cont, n_threads, specs[k], false, &o)) return 1;
        const rk_kv_bytes *b = &o.kb;
        /* compressed rows only: every part but the exact rows, per compressed+evicted row */
        double comp = (double)(b->total - b->exact), n_c = (double)(b->n_compressed_rows + b->n_evicted_rows);
        double f16_row = (double)b->f16_equiv / b->n_tokens;
        char name[64];
        snprintf(name, sizeof name, strncmp(specs[k], "kv=", 3) ? "lowram:%s" : "%s", specs[k]);
        printf("%-44s %8.4f %+8.4f %8.5f %7.3f %9.0f %8.2f %8.2f %8.1f %7.2f %7.2f %9.1f %8.3f %7.4f%s\n", name, o.nll,
               o.nll - ref.nll, o.kl, o.top1, (double)b->total / b->n_tokens, (double)b->f16_equiv / b->total,
               n_c > 0 ? f16_row * n_c / comp : 0, 1000 * o.dec_s, o.ls.seconds_fit, o.pf_s, 1000 * o.dec_cpu_s,
               o.ls.rows_attended ? (double)o.ls.rows_rebuilt / (double)o.ls.rows_attended : 0.0, o.kl_max,
               o.reused ? " (imported)" : "");
        if (json || k == 0 || n_specs == 1)
            printf(
                "    bytes: exact %llu coef %llu bases %llu pred %llu resid %llu lmk %llu meta %llu kcache %llu = %llu "
                "(f16 %llu); rows exact %lld comp %lld evicted %lld; scratch %llu\n"
                "    rank %d..%d, key energy lost %.4f, value R² mean %.3f, resid rows %lld, rebuilt/attended %.2f, "
                "compress %.3f s\n",
                (unsigned long long)b->exact, (unsigned long long)b->coef, (unsigned long long)b->bases,
                (unsigned long long)b->predictors, (unsigned long long)b->residuals, (unsigned long long)b->landmarks,
                (unsigned long long)b->meta, (unsigned long long)b->key_cache, (unsigned long long)b->total,
                (unsigned long long)b->f16_equiv, (long long)b->n_exact_rows, (long long)b->n_compressed_rows,
                (long long)b->n_evicted_rows, (unsigned long long)b->scratch, o.ls.rank_min, o.ls.rank_max,
                o.ls.key_rel_err, o.ls.value_r2_mean, (long long)o.ls.n_resid_rows,
                o.ls.rows_attended ? (double)o.ls.rows_rebuilt / (double)o.ls.rows_attended : 0.0,
                o.ls.seconds_compress);
        if (r2 && k == 0) {
            printf("    value R² per layer (KV heads):");
            for (int l = 0; l < hp->n_layer && l < 1024; l++) {
                printf("%s%2d:", l % 6 ? "  " : "\n     ", l);
                for (int h = 0; h < hp->n_head_kv && h < 64; h++) printf(" %.2f", (double)o.r2[l][h]);
            }
            printf("\n");
        }
        fflush(stdout);
    }
    free(g_ref_lp), free(g_ref_top), free(ids);
    rk_model_destroy(m);
    return 0;
}
