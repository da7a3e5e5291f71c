/* bootstrap_tcp.c - the TCP rendezvous behind torchrun-style environment variables.
 *
 * Star topology: rank 0 listens on MASTER_ADDR:MASTER_PORT; every other rank connects
 * (retrying with exponential backoff until the timeout, because rank 0 may start later)
 * and says hello (its rank, the world size, its host).  When all size-1 peers are in,
 * rank 0 answers each with a welcome carrying the local rank it computed from the host
 * names.  The connections stay open: an all-gather is every peer sending its blob to
 * rank 0 and rank 0 sending the concatenation back.  Ranks are few (one per GPU) and
 * blobs small (an NCCL id), so a star is plenty.
 *
 * Wire format: every message is a 16-byte header (magic, type, payload length; network
 * byte order) followed by the payload, so a stray connection or a peer from another job
 * is recognised instead of misread.  Sockets are non-blocking and every read/write waits
 * with poll() against one deadline, so nothing can hang past the timeout.  A failing rank 0
 * sends an error message to its peers before it closes, so they report the real cause. */
#include "bootstrap_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MSG_MAGIC 0x48525448u   /* "HRTH" */
#define PROTO_VERSION 1u
#define HELLO_WAIT_MS 2000      /* a connection that says nothing this long is dropped */
#define MAX_BLOB ((uint64_t)1 << 30)
#define IO_EOF (-1000000)       /* our own code: the peer closed the connection */

enum { MSG_HELLO = 1, MSG_WELCOME = 2, MSG_BLOB = 3, MSG_ALL = 4, MSG_ERROR = 5 };

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *io_strerror(int rc)
{
    if (rc == IO_EOF)
        return "connection closed by the other side";
    if (rc == -ETIMEDOUT)
        return "timed out";
    if (rc == -EPROTO)
        return "unexpected message (not a Hearth rank, or another version)";
    return strerror(-rc);
}

/* Waits until fd is ready for events or the deadline passes: 0, -ETIMEDOUT or -errno. */
static int wait_fd(int fd, short events, long long deadline)
{
    for (;;) {
        long long left = deadline - now_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = { .fd = fd, .events = events };
        int r = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
        if (r > 0)
            return 0;   /* readable, writable, or an error that the next call reports */
        if (r < 0 && errno != EINTR)
            return -errno;
    }
}

static int io_write_all(int fd, const void *buf, size_t n, long long deadline)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, deadline);
            if (rc)
                return rc;
        } else if (w < 0 && errno != EINTR) {
            return errno == EPIPE ? IO_EOF : -errno;
        }
    }
    return 0;
}

static int io_read_all(int fd, void *buf, size_t n, long long deadline)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
        } else if (r == 0) {
            return IO_EOF;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(fd, POLLIN, deadline);
            if (rc)
                return rc;
        } else if (errno != EINTR) {
            return errno == ECONNRESET ? IO_EOF : -errno;
        }
    }
    return 0;
}

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int msg_send(int fd, uint32_t type, const void *payload, size_t len, long long deadline)
{
    unsigned char h[16];
    put_u32(h, MSG_MAGIC);
    put_u32(h + 4, type);
    put_u32(h + 8, (uint32_t)((uint64_t)len >> 32));
    put_u32(h + 12, (uint32_t)len);
    int rc = io_write_all(fd, h, sizeof h, deadline);
    if (!rc && len)
        rc = io_write_all(fd, payload, len, deadline);
    return rc;
}

/* Reads a header: 0, an io error, or -EPROTO for bad magic / absurd length. */
static int msg_recv_hdr(int fd, uint32_t *type, uint64_t *len, long long deadline)
{
    unsigned char h[16];
    int rc = io_read_all(fd, h, sizeof h, deadline);
    if (rc)
        return rc;
    if (get_u32(h) != MSG_MAGIC)
        return -EPROTO;
    *type = get_u32(h + 4);
    *len = (uint64_t)get_u32(h + 8) << 32 | get_u32(h + 12);
    if (*len > MAX_BLOB)
        return -EPROTO;
    return 0;
}

/* Reads an error message's text (at most cap-1 bytes kept, the rest drained). */
static void msg_recv_text(int fd, uint64_t len, char *text, size_t cap, long long deadline)
{
    size_t keep = len < cap - 1 ? (size_t)len : cap - 1;
    text[0] = '\0';
    if (io_read_all(fd, text, keep, deadline))
        return;
    text[keep] = '\0';
}

static void set_socket_opts(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Best effort: tells every connected peer why rank 0 gives up, so their errors say it.
 * Closing a socket that still has unread bytes (a blob we did not read) makes the kernel
 * reset the connection, and the peer may then see the reset instead of our message; so
 * we half-close and read until each peer has hung up (bounded by a short deadline). */
static void broadcast_error(bootstrap *b, const char *text)
{
    long long deadline = now_ms() + 2000;
    for (int i = 1; i < b->size; i++) {
        if (b->fds[i] < 0)
            continue;
        msg_send(b->fds[i], MSG_ERROR, text, strlen(text), deadline);
        shutdown(b->fds[i], SHUT_WR);
    }
    for (int i = 1; i < b->size; i++) {
        char sink[4096];
        while (b->fds[i] >= 0) {
            ssize_t r = recv(b->fds[i], sink, sizeof sink, 0);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                break;
            if (r < 0 && wait_fd(b->fds[i], POLLIN, deadline))
                break;
        }
    }
}

static int resolve(const char *host, int port, struct addrinfo **res, hearth_err *err)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
    int g = getaddrinfo(host, ps, &hints, res);
    if (g)
        return herr_set(err, HERR_RUNTIME, "MASTER_ADDR %s: cannot resolve: %s", host,
                        gai_strerror(g));
    return 0;
}

/* Binds and listens on one address; returns the socket or -1 with errno set. */
static int listen_on(const struct sockaddr *sa, socklen_t len, int backlog)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (sa->sa_family == AF_INET6)   /* the wildcard takes IPv4 peers too */
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, sa, len) || listen(fd, backlog)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* Rank 0: where MASTER_ADDR is a numeric address of this host (127.0.0.1 in tests), it
 * listens there only.  Otherwise it listens on every interface, as torchrun does: a host
 * name may resolve differently here than on the other nodes (Debian maps the own host
 * name to 127.0.1.1), and a numeric address may belong to a NAT in front of us. */
static int listen_master(bootstrap *b, const bootstrap_tcp_opts *o, int *out, hearth_err *err)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", o->master_port);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_NUMERICHOST }, *res = NULL;
    int fd = -1, last = EADDRNOTAVAIL, backlog = b->size + 16;
    if (getaddrinfo(o->master_addr, ps, &hints, &res) == 0) {
        fd = listen_on(res->ai_addr, res->ai_addrlen, backlog);
        last = errno;
        freeaddrinfo(res);
    }
    if (fd < 0 && last == EADDRNOTAVAIL) {
        struct sockaddr_in6 any6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT,
                                     .sin6_port = htons((uint16_t)o->master_port) };
        fd = listen_on((struct sockaddr *)&any6, sizeof any6, backlog);
        if (fd < 0 && errno != EADDRINUSE) {   /* no IPv6 here */
            struct sockaddr_in any = { .sin_family = AF_INET,
                                       .sin_port = htons((uint16_t)o->master_port),
                                       .sin_addr.s_addr = htonl(INADDR_ANY) };
            fd = listen_on((struct sockaddr *)&any, sizeof any, backlog);
        }
        last = errno;
    }
    if (fd < 0)
        return herr_set(err, HERR_RUNTIME, "rank 0: cannot listen on %s: %s", b->master,
                        strerror(last));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    *out = fd;
    return 0;
}

/* "2, 5, 7" for the ranks that have not connected (at most 16 listed). */
static void missing_list(const bootstrap *b, char *s, size_t cap)
{
    size_t used = 0;
    int listed = 0, missing = 0;
    s[0] = '\0';
    for (int i = 1; i < b->size; i++) {
        if (b->fds[i] >= 0)
            continue;
        missing++;
        if (listed < 16 && used < cap) {
            used += (size_t)snprintf(s + used, cap - used, "%s%d", listed ? ", " : "", i);
            listed++;
        }
    }
    if (missing > listed && used < cap)
        snprintf(s + used, cap - used, " and %d more", missing - listed);
}

/* Rank 0: accepts until every peer has said a valid hello, or the deadline. */
static int gather_peers(bootstrap *b, int lfd, char (*hosts)[256], long long deadline,
                        hearth_err *err)
{
    int joined = 1;
    while (joined < b->size) {
        int rc = wait_fd(lfd, POLLIN, deadline);
        if (rc == -ETIMEDOUT) {
            char miss[256];
            missing_list(b, miss, sizeof miss);
            herr_set(err, HERR_RUNTIME, "rank 0: timed out after %.1f s waiting for rank%s "
                     "%s (of %d) to connect to %s", b->timeout_ms / 1000.0,
                     b->size - joined > 1 ? "s" : "", miss, b->size, b->master);
            broadcast_error(b, err->msg);
            return HERR_RUNTIME;
        }
        if (rc)
            return herr_set(err, HERR_RUNTIME, "rank 0: waiting on %s: %s", b->master,
                            io_strerror(rc));
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        int fd = accept4(lfd, (struct sockaddr *)&from, &fl, SOCK_CLOEXEC);
        if (fd < 0)
            continue;   /* EAGAIN after a spurious wake-up, or the client already left */
        set_socket_opts(fd);
        char who[INET6_ADDRSTRLEN + 8] = "?";
        getnameinfo((struct sockaddr *)&from, fl, who, sizeof who, NULL, 0, NI_NUMERICHOST);

        long long hd = now_ms() + HELLO_WAIT_MS;
        if (hd > deadline)
            hd = deadline;
        uint32_t type;
        uint64_t len;
        unsigned char hello[16 + 256];
        if (msg_recv_hdr(fd, &type, &len, hd) || type != MSG_HELLO || len < 16 ||
            len > sizeof hello - 1 || io_read_all(fd, hello, (size_t)len, hd)) {
            close(fd);   /* not one of ours (a port scan, another job): ignore it */
            continue;
        }
        uint32_t ver = get_u32(hello), r = get_u32(hello + 4), sz = get_u32(hello + 8);
        const char *problem = NULL;
        char why[512];
        if (ver != PROTO_VERSION) {
            problem = "protocol version differs (mixed hearth-train builds?)";
        } else if (sz != (uint32_t)b->size) {
            snprintf(why, sizeof why, "a peer from %s says WORLD_SIZE=%u, rank 0 has %d",
                     who, sz, b->size);
            problem = why;
        } else if (r == 0 || r >= sz) {
            snprintf(why, sizeof why, "a peer from %s says RANK=%u (expected 1..%d)", who, r,
                     b->size - 1);
            problem = why;
        } else if (b->fds[r] >= 0) {
            snprintf(why, sizeof why, "rank %u connected twice (again from %s)", r, who);
            problem = why;
        }
        if (problem) {
            herr_set(err, HERR_RUNTIME, "rank 0: %s", problem);
            msg_send(fd, MSG_ERROR, err->msg, strlen(err->msg), now_ms() + 1000);
            close(fd);
            broadcast_error(b, err->msg);
            return HERR_RUNTIME;
        }
        size_t hl = (size_t)len - 16;
        memcpy(hosts[r], hello + 16, hl);
        hosts[r][hl] = '\0';
        b->fds[r] = fd;
        joined++;
    }
    return 0;
}

static int join_master(bootstrap *b, const bootstrap_tcp_opts *o, long long deadline,
                       hearth_err *err)
{
    int lfd = -1, rc = listen_master(b, o, &lfd, err);
    if (rc)
        return rc;
    char (*hosts)[256] = calloc((size_t)b->size, sizeof *hosts);
    if (!hosts) {
        close(lfd);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    snprintf(hosts[0], sizeof hosts[0], "%s", b->node);
    rc = gather_peers(b, lfd, hosts, deadline, err);
    close(lfd);   /* everyone is in: nobody else may join this job */
    for (int i = 0; !rc && i < b->size; i++) {
        int local = 0;
        for (int j = 0; j < i; j++)
            local += !strcmp(hosts[j], hosts[i]);
        if (i == 0) {
            if (b->local_rank < 0)
                b->local_rank = local;
            continue;
        }
        unsigned char w[4];
        put_u32(w, (uint32_t)local);
        int wr = msg_send(b->fds[i], MSG_WELCOME, w, sizeof w, deadline + 1000);
        if (wr)
            rc = herr_set(err, HERR_RUNTIME, "rank 0: sending the welcome to rank %d: %s",
                          i, io_strerror(wr));
    }
    free(hosts);
    return rc;
}

/* A peer: connects to rank 0, retrying with backoff while it is not listening yet. */
static int connect_master(bootstrap *b, const bootstrap_tcp_opts *o, long long deadline,
                          int *out, hearth_err *err)
{
    int backoff = 10, last = ECONNREFUSED;
    for (;;) {
        struct addrinfo *res;
        int rc = resolve(o->master_addr, o->master_port, &res, err);
        if (rc)
            return herr_prefix(err, rc, "rank %d", b->rank);
        for (struct addrinfo *a = res; a; a = a->ai_next) {
            int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (fd < 0) {
                last = errno;
                continue;
            }
            set_socket_opts(fd);
            int c = connect(fd, a->ai_addr, a->ai_addrlen);
            if (c && errno == EINPROGRESS) {
                long long cd = now_ms() + 1000;
                if (cd > deadline)
                    cd = deadline;
                int e = 0;
                socklen_t el = sizeof e;
                if (wait_fd(fd, POLLOUT, cd) ||
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) || e) {
                    last = e ? e : ETIMEDOUT;
                    close(fd);
                    continue;
                }
                c = 0;
            }
            if (c) {
                last = errno;
                close(fd);
                continue;
            }
            freeaddrinfo(res);
            *out = fd;
            return 0;
        }
        freeaddrinfo(res);
        long long left = deadline - now_ms();
        if (left <= 0)
            return herr_set(err, HERR_RUNTIME, "rank %d: timed out after %.1f s connecting "
                            "to rank 0 at %s: %s", b->rank, b->timeout_ms / 1000.0,
                            b->master, strerror(last));
        struct timespec ts = { 0, (long)(backoff < left ? backoff : left) * 1000000L };
        nanosleep(&ts, NULL);
        backoff = backoff * 2 > 500 ? 500 : backoff * 2;
    }
}

static int join_peer(bootstrap *b, const bootstrap_tcp_opts *o, long long deadline,
                     hearth_err *err)
{
    int fd = -1, rc = connect_master(b, o, deadline, &fd, err);
    if (rc)
        return rc;
    b->fds[0] = fd;
    unsigned char hello[16 + 256];
    size_t hl = strlen(b->node);
    put_u32(hello, PROTO_VERSION);
    put_u32(hello + 4, (uint32_t)b->rank);
    put_u32(hello + 8, (uint32_t)b->size);
    put_u32(hello + 12, (uint32_t)b->local_rank);
    memcpy(hello + 16, b->node, hl);
    int sent = msg_send(fd, MSG_HELLO, hello, 16 + hl, deadline);
    /* Rank 0 answers once every rank is in, or with an error when it gives up at its own
     * deadline, which may lie a little after ours: wait somewhat longer for its reason.
     * Even when the hello could not be sent, rank 0's reason may be waiting. */
    long long wd = sent ? now_ms() + 1000 : deadline + b->timeout_ms / 2 + 1000;
    uint32_t type = 0;
    uint64_t len = 0;
    int io = msg_recv_hdr(fd, &type, &len, wd);
    if (sent && !(io == 0 && type == MSG_ERROR))
        return herr_set(err, HERR_RUNTIME, "rank %d: saying hello to rank 0 at %s: %s",
                        b->rank, b->master, io_strerror(sent));
    if (!io && type == MSG_ERROR) {
        char text[1024];
        msg_recv_text(fd, len, text, sizeof text, wd);
        return herr_set(err, HERR_RUNTIME, "rank %d: rank 0 gave up: %s", b->rank, text);
    }
    unsigned char w[4];
    if (!io && (type != MSG_WELCOME || len != sizeof w))
        io = -EPROTO;
    if (!io)
        io = io_read_all(fd, w, sizeof w, wd);
    if (io)
        return herr_set(err, HERR_RUNTIME, "rank %d: waiting for rank 0 at %s to admit "
                        "every rank: %s", b->rank, b->master, io_strerror(io));
    if (b->local_rank < 0)
        b->local_rank = (int)get_u32(w);
    return 0;
}

int bootstrap_tcp_join(bootstrap *b, const bootstrap_tcp_opts *o, hearth_err *err)
{
    b->kind = BOOTSTRAP_ENV;
    if (o->size < 1 || o->rank < 0 || o->rank >= o->size)
        return herr_set(err, HERR_CONFIG, "rank %d of %d: expected 0 <= rank < size",
                        o->rank, o->size);
    if (o->local_rank >= o->size)
        return herr_set(err, HERR_CONFIG, "local rank %d: expected < size %d", o->local_rank,
                        o->size);
    if (!o->master_addr || !*o->master_addr || o->master_port < 1 || o->master_port > 65535)
        return herr_set(err, HERR_CONFIG, "master address %s:%d: expected HOST:1..65535",
                        o->master_addr ? o->master_addr : "(none)", o->master_port);
    if (o->timeout_ms <= 0)
        return herr_set(err, HERR_CONFIG, "timeout %d ms: expected > 0", o->timeout_ms);
    b->rank = o->rank;
    b->size = o->size;
    b->local_rank = o->local_rank;
    b->timeout_ms = o->timeout_ms;
    if (gethostname(b->node, sizeof b->node - 1))
        strcpy(b->node, "localhost");
    snprintf(b->master, sizeof b->master, "%s:%d", o->master_addr, o->master_port);
    b->fds = malloc((size_t)b->size * sizeof *b->fds);
    if (!b->fds)
        return herr_set(err, HERR_NOMEM, "out of memory");
    for (int i = 0; i < b->size; i++)
        b->fds[i] = -1;
    if (b->size == 1) {
        b->local_rank = 0;
        return 0;
    }
    long long deadline = now_ms() + o->timeout_ms;
    return b->rank == 0 ? join_master(b, o, deadline, err) : join_peer(b, o, deadline, err);
}

int bootstrap_tcp_allgather(bootstrap *b, const void *mine, size_t n, void *all,
                            hearth_err *err)
{
    long long deadline = now_ms() + b->timeout_ms;
    unsigned char *out = all;
    if ((uint64_t)n * (uint64_t)b->size > MAX_BLOB)
        return herr_set(err, HERR_RUNTIME, "%zu bytes per rank: too large", n);
    if (b->rank != 0) {
        /* When the send fails, rank 0 may still have left its reason in our queue.  Rank 0
         * may have entered this call later than we did, and its deadline (after which it
         * tells us who is missing) is later than ours: wait somewhat longer for the answer. */
        int sent = msg_send(b->fds[0], MSG_BLOB, mine, n, deadline);
        long long rd = sent ? now_ms() + 1000 : deadline + b->timeout_ms / 2 + 1000;
        uint32_t type = 0;
        uint64_t len = 0;
        int io = msg_recv_hdr(b->fds[0], &type, &len, rd);
        if (sent && !(io == 0 && type == MSG_ERROR))
            io = sent;
        if (!io && type == MSG_ERROR) {
            char text[1024];
            msg_recv_text(b->fds[0], len, text, sizeof text, rd);
            return herr_set(err, HERR_RUNTIME, "rank 0 gave up: %s", text);
        }
        if (!io && (type != MSG_ALL || len != (uint64_t)n * (uint64_t)b->size))
            io = -EPROTO;
        if (!io)
            io = io_read_all(b->fds[0], out, n * (size_t)b->size, rd);
        if (io)
            return herr_set(err, HERR_RUNTIME, "exchanging with rank 0 at %s: %s", b->master,
                            io_strerror(io));
        return 0;
    }
    memmove(out, mine, n);
    for (int i = 1; i < b->size; i++) {
        uint32_t type = 0;
        uint64_t len = 0;
        int io = msg_recv_hdr(b->fds[i], &type, &len, deadline);
        if (!io && type != MSG_BLOB)
            io = -EPROTO;
        if (!io && len != n) {
            herr_set(err, HERR_RUNTIME, "rank %d sent %llu bytes, rank 0 has %zu (every rank "
                     "must pass the same size)", i, (unsigned long long)len, n);
            broadcast_error(b, err->msg);
            return HERR_RUNTIME;
        }
        if (!io)
            io = io_read_all(b->fds[i], out + (size_t)i * n, n, deadline);
        if (io) {
            herr_set(err, HERR_RUNTIME, "waiting for the blob of rank %d: %s", i,
                     io_strerror(io));
            broadcast_error(b, err->msg);
            return HERR_RUNTIME;
        }
    }
    for (int i = 1; i < b->size; i++) {
        int io = msg_send(b->fds[i], MSG_ALL, out, n * (size_t)b->size, deadline);
        if (io)
            return herr_set(err, HERR_RUNTIME, "sending the result to rank %d: %s", i,
                            io_strerror(io));
    }
    return 0;
}

void bootstrap_tcp_close(bootstrap *b)
{
    if (!b->fds)
        return;
    for (int i = 0; i < b->size; i++) {
        if (b->fds[i] < 0)
            continue;
        /* Closing with unread bytes makes the kernel reset the connection, which can
         * discard an error message we just sent; read what has arrived first. */
        char sink[4096];
        for (int k = 0; k < 256 && recv(b->fds[i], sink, sizeof sink, MSG_DONTWAIT) > 0; k++)
            ;
        close(b->fds[i]);
    }
    free(b->fds);
    b->fds = NULL;
}
