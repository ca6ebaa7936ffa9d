/* serve --http's connection layer on libmicrohttpd (serve_conn.c): each TCP connection's
 * phase and age, shedding of idle and slow connections, the header checks of serve_guard.c
 * on a request (with the CORS preflight), and the watch on a client that leaves while its
 * non-streamed answer is made. docs/HTTP.md, "Security model". */
#pragma once
#include <microhttpd.h>
#include <stdbool.h>

#include "rk_gen.h"
#include "serve_guard.h"

#define SERVE_CONN_MAX 64     /* connections at once (MHD's limit) */
#define SERVE_CONN_RESERVE 8  /* a new connection that leaves fewer free sheds the oldest idle one */
#define SERVE_CONN_IDLE_S 10  /* headers, or the next request on a kept-alive connection, within this */
#define SERVE_CONN_BODY_S 30  /* the body, from the end of the headers */
#define SERVE_CONN_WORK_S 600 /* MHD's inactivity limit while a generation answers */

enum { SERVE_CONN_IDLE, SERVE_CONN_BODY, SERVE_CONN_WORK };

/* MHD_OPTION_NOTIFY_CONNECTION: a connection's slot, made at its start, gone at its close. */
void serve_conn_notify(void *cls, struct MHD_Connection *c, void **sock_ctx, enum MHD_ConnectionNotificationCode toe);
/* The connection enters a phase (SERVE_CONN_*), from now. */
void serve_conn_phase(struct MHD_Connection *c, int phase);
/* Whether the request's body has been arriving for longer than SERVE_CONN_BODY_S. */
bool serve_conn_body_late(struct MHD_Connection *c);
/* Sheds (shutdown(2)) the connections past their phase's time limit; called once a second. */
void serve_conn_reap(void);
/* Connections shed and answers cancelled so far. */
void serve_conn_stats(unsigned long long *shed, unsigned long long *cancelled);
void serve_conn_count_cancel(void);

/* The header checks of a request, before its body is read: Host, Origin (an OPTIONS
 * preflight of an allowed origin is answered here, 204), the API key (not for /health), and
 * a POST body's type. MHD_YES with *done false: the request goes on; otherwise the answer
 * (or MHD_NO) is the result, *done true. */
enum MHD_Result serve_conn_admit(const serve_guard *g, struct MHD_Connection *c, const char *url, const char *method,
                                 bool *done);
/* The CORS headers of an answer to a request whose Origin admit let through. */
void serve_conn_cors(struct MHD_Connection *c, struct MHD_Response *r);

/* A non-streamed answer is written only at its end: meanwhile the socket is watched, and a
 * client that closed it stops the generation at the next token or prefill chunk. */
typedef struct serve_conn_watch {
    int fd;
    bool gone; /* the client went away */
} serve_conn_watch;

/* Points gp's token and progress callbacks at w (they must be free), watching c's socket. */
void serve_conn_watch_client(struct MHD_Connection *c, rk_gen_params *gp, serve_conn_watch *w);
