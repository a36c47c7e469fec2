#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#define CAP 4096
#define MAX_HOLD_MS 10000

static uint32_t ids[CAP];
static uint64_t due[CAP];
static unsigned head, count;
static uint64_t hold_ms;
static unsigned long long n_held, n_immediate, n_released_on_exit, n_verdict_errors, n_enobufs;
static struct nfq_q_handle *qh;
static volatile sig_atomic_t stop;

static void on_signal(int sig) { (void)sig; stop = 1; }

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void accept_id(uint32_t id) {
    if (nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL) < 0)
        n_verdict_errors++;
}

static int on_packet(struct nfq_q_handle *q, struct nfgenmsg *msg, struct nfq_data *d, void *data) {
    (void)q; (void)msg; (void)data;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(d);
    if (ph == NULL)
        return 0;
    uint32_t id = ntohl(ph->packet_id);
    if (count == CAP) {
        accept_id(id);
        n_immediate++;
        return 0;
    }
    unsigned slot = (head + count) % CAP;
    ids[slot] = id;
    due[slot] = now_ms() + hold_ms;
    count++;
    n_held++;
    return 0;
}

static void release_due(uint64_t now) {
    while (count > 0 && due[head] <= now) {
        accept_id(ids[head]);
        head = (head + 1) % CAP;
        count--;
    }
}

static unsigned long parse_num(const char *s, const char *what) {
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') {
        fprintf(stderr, "nfq-holder: bad %s '%s'\n", what, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s QUEUE HOLD_MS\n", argv[0]);
        return 2;
    }
    unsigned long queue = parse_num(argv[1], "queue number");
    if (queue > 65535) {
        fprintf(stderr, "nfq-holder: queue number %lu > 65535\n", queue);
        return 2;
    }
    hold_ms = parse_num(argv[2], "hold");
    if (hold_ms > MAX_HOLD_MS)
        hold_ms = MAX_HOLD_MS;

    sigset_t block, empty;
    sigemptyset(&empty);
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    struct nfq_handle *h = nfq_open();
    if (h == NULL) {
        perror("nfq-holder: nfq_open");
        return 1;
    }
    qh = nfq_create_queue(h, (uint16_t)queue, on_packet, NULL);
    if (qh == NULL) {
        fprintf(stderr, "nfq-holder: cannot bind queue %lu (another program on it?): %s\n",
                queue, strerror(errno));
        nfq_close(h);
        return 1;
    }
    if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) {
        perror("nfq-holder: nfq_set_mode");
        nfq_destroy_queue(qh);
        nfq_close(h);
        return 1;
    }
    nfq_set_queue_maxlen(qh, CAP);
    nfq_set_queue_flags(qh, NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_FAIL_OPEN);
    int fd = nfq_fd(h);
    int rcvbuf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);

    printf("ready queue=%lu hold_ms=%llu\n", queue, (unsigned long long)hold_ms);
    fflush(stdout);

    static char buf[1 << 16] __attribute__((aligned));
    while (!stop) {
        uint64_t now = now_ms();
        release_due(now);
        uint64_t wait = 1000;
        if (count > 0)
            wait = due[head] > now ? due[head] - now : 0;
        struct timespec to = { (time_t)(wait / 1000), (long)(wait % 1000) * 1000000L };
        struct pollfd p = { fd, POLLIN, 0 };
        int r = ppoll(&p, 1, &to, &empty);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            perror("nfq-holder: ppoll");
            break;
        }
        if (r == 0)
            continue;
        for (;;) {
            ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n < 0) {
                if (errno == ENOBUFS) {
                    n_enobufs++;
                    continue;
                }
                break;
            }
            nfq_handle_packet(h, buf, (int)n);
        }
    }

    n_released_on_exit = count;
    while (count > 0) {
        accept_id(ids[head]);
        head = (head + 1) % CAP;
        count--;
    }
    printf("held=%llu immediate=%llu released_on_exit=%llu verdict_errors=%llu enobufs=%llu\n",
           n_held, n_immediate, n_released_on_exit, n_verdict_errors, n_enobufs);
    fflush(stdout);
    nfq_destroy_queue(qh);
    nfq_close(h);
    return 0;
}
