/* serve --http's connection layer: see serve_conn.h.
 * Each TCP connection has a slot (MHD's socket context) with its phase and since when:
 * IDLE (no request yet, or between keep-alive requests: headers may be arriving), BODY
 * (headers read, the body arriving) or WORK (a generation answers it). The main thread
 * sheds IDLE connections older than SERVE_CONN_IDLE_S and BODY ones older than
 * SERVE_CONN_BODY_S (shutdown(2): the connection's own thread sees the end and closes it),
 * and a new connection that leaves fewer than SERVE_CONN_RESERVE free slots sheds the
 * oldest IDLE one, so idle or half-open sockets cannot lock other clients out. */
#include "serve_conn.h"

#include <errno.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

typedef struct conn_slot {
    int fd;
    int phase;
    double since;
    bool shed;
} conn_slot;

static pthread_mutex_t g_conn_mu = PTHREAD_MUTEX_INITIALIZER;
static conn_slot *g_conn[SERVE_CONN_MAX + 1];
static unsigned long long g_shed, g_cancelled;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The slot goes (under g_conn_mu) when MHD reports the close, before it closes the socket,
 * so s->fd is still this connection's. */
static void shed_locked(conn_slot *s) {
    if (s->shed) return;
    s->shed = true;
    shutdown(s->fd, SHUT_RDWR);
    g_shed++;
}

void serve_conn_notify(void *cls, struct MHD_Connection *c, void **sock_ctx, enum MHD_ConnectionNotificationCode toe) {
    (void)cls;
    pthread_mutex_lock(&g_conn_mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_slot *s = ci ? calloc(1, sizeof *s) : NULL;
        int n = 0, oldest = -1, free_at = -1;
        for (int i = 0; i < SERVE_CONN_MAX + 1; i++) {
            if (!g_conn[i]) {
                if (free_at < 0) free_at = i;
                continue;
            }
            if (!g_conn[i]->shed) n++;
            if (g_conn[i]->phase == SERVE_CONN_IDLE && !g_conn[i]->shed &&
                (oldest < 0 || g_conn[i]->since < g_conn[oldest]->since))
                oldest = i;
        }
        if (s && free_at >= 0) {
            *s = (conn_slot){.fd = ci->connect_fd, .phase = SERVE_CONN_IDLE, .since = now_s()};
            g_conn[free_at] = s;
            *sock_ctx = s;
            if (n + 1 > SERVE_CONN_MAX - SERVE_CONN_RESERVE && oldest >= 0) shed_locked(g_conn[oldest]);
        } else {
            free(s);
        }
    } else if (*sock_ctx) {
        for (int i = 0; i < SERVE_CONN_MAX + 1; i++)
            if (g_conn[i] == *sock_ctx) g_conn[i] = NULL;
        free(*sock_ctx);
        *sock_ctx = NULL;
    }
    pthread_mutex_unlock(&g_conn_mu);
}

static conn_slot *slot_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void serve_conn_phase(struct MHD_Connection *c, int phase) {
    conn_slot *s = slot_of(c);
    if (!s) return;
    pthread_mutex_lock(&g_conn_mu);
    s->phase = phase;
    s->since = now_s();
    pthread_mutex_unlock(&g_conn_mu);
    /* a stream waiting in line sends nothing for a while: MHD must not take that for idleness */
    if (phase == SERVE_CONN_WORK)
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)SERVE_CONN_WORK_S);
}

bool serve_conn_body_late(struct MHD_Connection *c) {
    conn_slot *s = slot_of(c);
    bool late = false;
    pthread_mutex_lock(&g_conn_mu);
    if (s && s->phase == SERVE_CONN_BODY && now_s() - s->since > SERVE_CONN_BODY_S) late = true;
    pthread_mutex_unlock(&g_conn_mu);
    return late;
}

void serve_conn_reap(void) {
    const double t = now_s();
    pthread_mutex_lock(&g_conn_mu);
    for (int i = 0; i < SERVE_CONN_MAX + 1; i++) {
        conn_slot *s = g_conn[i];
        if (s && ((s->phase == SERVE_CONN_IDLE && t - s->since > SERVE_CONN_IDLE_S) ||
                  (s->phase == SERVE_CONN_BODY && t - s->since > SERVE_CONN_BODY_S)))
            shed_locked(s);
    }
    pthread_mutex_unlock(&g_conn_mu);
}

static bool client_here(serve_conn_watch *w) {
    if (w->gone || w->fd < 0) return !w->gone;
    char b;
    ssize_t k = recv(w->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) w->gone = true;
    return !w->gone;
}

static bool watch_token(void *ud, int32_t tok, const char *text, size_t n) {
    (void)tok, (void)text, (void)n;
    return client_here(ud);
}

static bool watch_prefill(void *ud, int64_t done, int64_t total) {
    (void)done, (void)total;
    return client_here(ud);
}

void serve_conn_watch_client(struct MHD_Connection *c, rk_gen_params *gp, serve_conn_watch *w) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    *w = (serve_conn_watch){.fd = ci ? ci->connect_fd : -1};
    gp->on_token = watch_token;
    gp->token_ud = w;
    gp->progress = watch_prefill;
    gp->progress_ud = w;
}

/* An Origin that got this far is allowed (admit), so the answer names it. */
void serve_conn_cors(struct MHD_Connection *c, struct MHD_Response *r) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ORIGIN);
    if (!origin) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
    MHD_add_response_header(r, "Vary", "Origin");
}

void serve_conn_stats(unsigned long long *shed, unsigned long long *cancelled) {
    pthread_mutex_lock(&g_conn_mu);
    *shed = g_shed;
    *cancelled = g_cancelled;
    pthread_mutex_unlock(&g_conn_mu);
}

void serve_conn_count_cancel(void) {
    pthread_mutex_lock(&g_conn_mu);
    g_cancelled++;
    pthread_mutex_unlock(&g_conn_mu);
}

/* ---- admission ----------------------------------------------------------------------- */
/* A refusal of admit's checks, in OpenAI's shape: {"error": {"message", "type", "param",
 * "code"}} with the code a name ("invalid_api_key", as OpenAI answers a bad key). */
static enum MHD_Result send_refusal(struct MHD_Connection *c, const serve_verdict *v) {
    json_object *o = json_object_new_object(), *e = json_object_new_object();
    json_object_object_add(e, "message", json_object_new_string(v->msg));
    json_object_object_add(e, "type", json_object_new_string(v->type));
    json_object_object_add(e, "param", NULL);
    json_object_object_add(e, "code", json_object_new_string(v->code));
    json_object_object_add(o, "error", e);
    size_t n = 0;
    const char *s = json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &n);
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)s, MHD_RESPMEM_MUST_COPY);
    json_object_put(o);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (v->status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    serve_conn_cors(c, r);
    enum MHD_Result ret = MHD_queue_response(c, v->status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result serve_conn_admit(const serve_guard *g, struct MHD_Connection *c, const char *url, const char *method,
                                 bool *done) {
    serve_verdict v;
    *done = true;
#define HDR(name) MHD_lookup_connection_value(c, MHD_HEADER_KIND, name)
    if (!serve_guard_host(g, HDR(MHD_HTTP_HEADER_HOST), &v) || !serve_guard_origin(g, HDR(MHD_HTTP_HEADER_ORIGIN), &v))
        return send_refusal(c, &v);
    if (!strcmp(method, MHD_HTTP_METHOD_OPTIONS)) { /* CORS preflight of an allowed origin */
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        const char *want = HDR("Access-Control-Request-Headers");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", want ? want : "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        serve_conn_cors(c, r);
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (strcmp(url, "/health") && !serve_guard_auth(g, HDR(MHD_HTTP_HEADER_AUTHORIZATION), &v))
        return send_refusal(c, &v);
    if (!strcmp(method, MHD_HTTP_METHOD_POST) && !serve_guard_json_type(HDR(MHD_HTTP_HEADER_CONTENT_TYPE), &v))
        return send_refusal(c, &v);
#undef HDR
    *done = false;
    return MHD_YES;
}
