/* --kv-budget keeps its promise or says so: the binary spawned on a generated model. A spill
 * file that cannot grow (RLIMIT_FSIZE: every spill write fails with EFBIG, as on a full
 * disk) gives the same answer as the unbudgeted run and one warning line naming the reason;
 * a spill directory that cannot hold a file refuses the run with the reason; q4 with a budget
 * is bad usage (exit 2). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tb.h"

typedef struct child {
    int code;
    char out[16384], err[16384];
} child;

static const char *g_in; /* the child's stdin (NULL: /dev/null) */

/* Runs ridgekv with args; tmpdir: its TMPDIR; fsize > 0: RLIMIT_FSIZE (SIGXFSZ ignored).
 * stdout and stderr are pipes (no file limit applies to them). */
static void spawn(child *c, const char *tmpdir, rlim_t fsize, char *const args[]) {
    const char *b = getenv("RK_BIN");
    cr_assert(b, "RK_BIN not set (meson sets it)");
    char *argv[40];
    int n = 0;
    argv[n++] = (char *)b;
    while (args[n - 1] && n < 39) argv[n] = args[n - 1], n++;
    argv[n] = NULL;
    int po[2], pe[2];
    cr_assert(!pipe(po) && !pipe(pe));
    const pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        dup2(po[1], 1), dup2(pe[1], 2);
        close(po[0]), close(pe[0]), close(po[1]), close(pe[1]);
        int in = open(g_in ? g_in : "/dev/null", O_RDONLY);
        if (in >= 0) dup2(in, 0);
        setenv("TMPDIR", tmpdir, 1);
        setenv("XDG_CACHE_HOME", tmpdir, 1); /* no document cache of the user's */
        if (fsize > 0) {
            signal(SIGXFSZ, SIG_IGN);
            struct rlimit r = {fsize, fsize};
            setrlimit(RLIMIT_FSIZE, &r);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    close(po[1]), close(pe[1]);
    size_t no = 0, ne = 0;
    struct pollfd fds[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
    int open_fds = 2;
    while (open_fds > 0 && poll(fds, 2, 60000) > 0)
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
            char *buf = i ? c->err : c->out;
            size_t *len = i ? &ne : &no;
            const ssize_t r = read(fds[i].fd, buf + *len, sizeof c->out - 1 - *len);
            if (r <= 0) {
                close(fds[i].fd);
                fds[i].fd = -1, open_fds--;
            } else {
                *len += (size_t)r;
            }
        }
    c->out[no] = c->err[ne] = '\0';
    int status = 0;
    waitpid(pid, &status, 0);
    c->code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

/* A generated model of stories260K's shape with a 4096-token context; a prompt file of about
 * 1500 tokens (its KV: 1500 x 640 bytes, a dozen chunks of 256 rows per layer past the hot ones). */
static void fixture(char *model, size_t mcap, char *prompt, size_t pcap, char *dir, size_t dcap) {
    tb_tiny_spec spec = tb_tiny_stories_spec(5);
    spec.n_ctx_train = 4096;
    cr_assert(tb_tiny_model(&spec, model, mcap), "%s", model);
    snprintf(dir, dcap, "/tmp/rkbudgetXXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(prompt, pcap, "%s/prompt.txt", dir);
    FILE *f = fopen(prompt, "w");
    cr_assert(f);
    uint64_t seed = 3;
    for (int i = 0; i < 1500; i++) fputc("abcdefgh ijklmno pqrst uvwxyz"[tb_rand_u64(&seed) % 29], f);
    fclose(f);
}

Test(budget, full_spill_file_warns_once_and_answers_the_same) {
    char model[512], prompt[512], dir[64];
    fixture(model, sizeof model, prompt, sizeof prompt, dir, sizeof dir);
    char *base[] = {"run", "-m", model, "-f", prompt, "-n", "6", "--temp", "0", "-c", "4096", "-t", "2", NULL};
    char *budg[] = {"run", "-m", model,  "-f", prompt, "-n",          "6",   "--temp",
                    "0",   "-c", "4096", "-t", "2",    "--kv-budget", "64K", NULL};
    static child a, b, c;
    spawn(&a, dir, 0, base);
    cr_assert_eq(a.code, 0, "%s", a.err);
    /* the budget kept: no warning */
    spawn(&b, dir, 0, budg);
    cr_assert_eq(b.code, 0, "%s", b.err);
    cr_expect_eq(count(b.err, "cannot be kept"), 0, "%s", b.err);
    cr_expect_str_eq(b.out, a.out);
    /* every spill write fails (a spill file limited to 4 KiB): one warning with the reason */
    spawn(&c, dir, 4096, budg);
    cr_assert_eq(c.code, 0, "%s", c.err);
    cr_expect_eq(count(c.err, "cannot be kept"), 1, "%s", c.err);
    cr_expect(strstr(c.err, "writing to ") && (strstr(c.err, "disk full") || strstr(c.err, "File too large")),
              "the reason: %s", c.err);
    cr_expect(strstr(c.err, "spills failed"), "%s", c.err);
    cr_expect_str_eq(c.out, a.out, "the rows stay in memory: the same answer");
    unlink(prompt), unlink(model), rmdir(dir);
}

Test(budget, spill_directory_that_cannot_hold_a_file_refuses) {
    char model[512], prompt[512], dir[64];
    fixture(model, sizeof model, prompt, sizeof prompt, dir, sizeof dir);
    char *args[] = {"run", "-m", model, "-f", prompt, "-n", "2", "-c", "4096", "-t", "2", "--kv-budget", "64K", NULL};
    static child c;
    spawn(&c, prompt, 0, args);                            /* TMPDIR is a file, not a directory */
    cr_expect_eq(c.code, 5, "exit %d: %s", c.code, c.err); /* RK_EXIT_IO */
    cr_expect_eq(count(c.err, "KV budget cannot be kept"), 1, "%s", c.err);
    cr_expect(strstr(c.err, "Not a directory"), "%s", c.err);
    unlink(prompt), unlink(model), rmdir(dir);
}

Test(budget, q4_or_eviction_with_a_budget_is_bad_usage) {
    char model[512], prompt[512], dir[64];
    fixture(model, sizeof model, prompt, sizeof prompt, dir, sizeof dir);
    static child c;
    char *q4[] = {"run", "-m", model, "-p", "hi", "-n", "1", "--kv", "q4", "--kv-budget", "1M", NULL};
    spawn(&c, dir, 0, q4);
    cr_expect_eq(c.code, 2, "exit %d: %s", c.code, c.err);
    cr_expect(strstr(c.err, "q4") && strstr(c.err, "--kv-budget"), "%s", c.err);
    char *ev[] = {"run", "-m", model, "-p", "hi", "-n", "1", "--kv", "lowram:evict=0.5", "--kv-budget", "1M", NULL};
    spawn(&c, dir, 0, ev);
    cr_expect_eq(c.code, 2, "exit %d: %s", c.code, c.err);
    cr_expect(strstr(c.err, "evict"), "%s", c.err);
    /* the default policy takes a budget (f16 rows): no refusal */
    char *f16[] = {"run", "-m", model, "-p", "hi", "-n", "1", "-c", "1024", "--kv-budget", "1M", NULL};
    spawn(&c, dir, 0, f16);
    cr_expect_eq(c.code, 0, "exit %d: %s", c.code, c.err);
    unlink(prompt), unlink(model), rmdir(dir);
}

/* Every surface with everything on: a model with YaRN in its GGUF, RidgeFill quality (maps
 * fitted by calibrate), LowRAM under a KV budget, the document cache. Each command exits 0;
 * ask's second run loads the cached document and answers the same; an f16 budget answers as
 * the unbudgeted f16 run does. */
Test(budget, every_surface_composes_under_yarn) {
    char model[512], prompt[512], dir[64], maps[600], doc[600];
    tb_tiny_spec spec = tb_tiny_stories_spec(9);
    spec.n_ctx_train = 1024;
    spec.rope_scaling = "yarn";
    spec.rope_factor = 4.0f;
    cr_assert(tb_tiny_model(&spec, model, sizeof model), "%s", model);
    snprintf(dir, sizeof dir, "/tmp/rkcomposeXXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(prompt, sizeof prompt, "%s/cal.txt", dir);
    snprintf(doc, sizeof doc, "%s/doc.txt", dir);
    snprintf(maps, sizeof maps, "%s/maps.gguf", dir);
    uint64_t seed = 4;
    for (int f = 0; f < 2; f++) {
        FILE *o = fopen(f ? doc : prompt, "w");
        cr_assert(o);
        for (int i = 0; i < 2600; i++) fputc("abcdefgh ijklmno pqrst uvwxyz"[tb_rand_u64(&seed) % 29], o);
        fclose(o);
    }
    static child c, d;
    char *cal[] = {"calibrate", "-m", model, "--text", prompt, "-o", maps, "--seg-len", "256", "--split", "2", NULL};
    spawn(&c, dir, 0, cal);
    cr_assert_eq(c.code, 0, "calibrate: %s", c.err);
#define ALL "-m", model, "-c", "4096", "-t", "2", "--ridgefill", maps, "--tail", "512"
    char *ask[] = {"ask", ALL,  "--kv", "lowram", "--kv-budget", "32K",  "--doc",
                   doc,   "-n", "4",    "--temp", "0",           "who?", NULL};
    spawn(&c, dir, 0, ask);
    cr_assert_eq(c.code, 0, "ask: %s", c.err);
    spawn(&d, dir, 0, ask);
    cr_assert_eq(d.code, 0, "ask again: %s", d.err);
    cr_expect(strstr(d.err, "reused cached KV"), "%s", d.err);
    cr_expect_str_eq(c.out, d.out, "the cached ask answers the same");
    char *f16b[] = {"ask", ALL, "--kv-budget", "32K", "--no-cache", "--doc", doc,
                    "-n",  "4", "--temp",      "0",   "who?",       NULL};
    char *f16[] = {"ask", ALL, "--no-cache", "--doc", doc, "-n", "4", "--temp", "0", "who?", NULL};
    spawn(&c, dir, 0, f16b);
    spawn(&d, dir, 0, f16);
    cr_assert(c.code == 0 && d.code == 0, "%s / %s", c.err, d.err);
    cr_expect_str_eq(c.out, d.out, "an f16 budget answers as the unbudgeted run");
    char *run[] = {"run", ALL, "--kv", "lowram", "--kv-budget", "32K", "-f", doc, "-n", "4", NULL};
    spawn(&c, dir, 0, run);
    cr_expect_eq(c.code, 0, "run: %s", c.err);
    char *bench[] = {"bench", ALL,    "--fill", "quality", "--kv", "lowram,q8", "--kv-budget", "25%",
                     "-p",    "1500", "-n",     "2",       "-r",   "1",         NULL};
    spawn(&c, dir, 0, bench);
    cr_expect_eq(c.code, 0, "bench: %s", c.err);
    cr_expect(strstr(c.err, "kv tier"), "%s", c.err);
    char in[640];
    snprintf(in, sizeof in, "%s/in.txt", dir);
    FILE *o = fopen(in, "w");
    cr_assert(o);
    fputs("hello there\n", o);
    fclose(o);
    g_in = in;
    char *chat[] = {"chat", ALL, "--kv", "lowram", "--kv-budget", "32K", "-n", "4", NULL};
    spawn(&c, dir, 0, chat);
    cr_expect_eq(c.code, 0, "chat: %s", c.err);
    o = fopen(in, "w");
    cr_assert(o);
    fputs("{\"op\":\"ask\",\"id\":1,\"docs\":[{\"text\":\"", o);
    for (int i = 0; i < 2600; i++) fputc("abcdefgh ijklmno pqrst uvwxyz"[tb_rand_u64(&seed) % 29], o);
    fputs("\",\"name\":\"d\"}],\"question\":\"who?\",\"max_tokens\":4}\n", o);
    fclose(o);
    char *serve[] = {"serve", "--jsonl", ALL, "--kv", "lowram", "--kv-budget", "32K", NULL};
    spawn(&c, dir, 0, serve);
    g_in = NULL;
    cr_expect_eq(c.code, 0, "serve: %s", c.err);
    cr_expect(strstr(c.out, "\"event\":\"done\""), "serve: %s / %s", c.out, c.err);
    unlink(in);
#undef ALL
    unlink(prompt), unlink(doc), unlink(maps), unlink(model);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}
