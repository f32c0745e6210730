/*
 * queue, classic C peer: a bounded ring of copied messages guarded by one
 * mutex with two condition variables (not_empty, not_full), signalled on
 * every put/get, as in the textbook design.
 *
 * usage: queue_ring [producers=1] [per_producer=500000]
 */
#include "queue.h"

static struct {
    pthread_mutex_t mu;
    pthread_cond_t not_empty, not_full;
    size_t head, count;
    msg_t slot[QCAP];
} ring = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, {{0, 0}}};

static void q_setup(void) {}
static void q_thread_start(void) {}

static void q_put(const msg_t *m) {
    pthread_mutex_lock(&ring.mu);
    while (ring.count == QCAP) pthread_cond_wait(&ring.not_full, &ring.mu);
    memcpy(&ring.slot[(ring.head + ring.count) % QCAP], m, sizeof *m);
    ring.count++;
    pthread_cond_signal(&ring.not_empty);
    pthread_mutex_unlock(&ring.mu);
}

static void q_get(msg_t *m) {
    pthread_mutex_lock(&ring.mu);
    while (ring.count == 0) pthread_cond_wait(&ring.not_empty, &ring.mu);
    memcpy(m, &ring.slot[ring.head], sizeof *m);
    ring.head = (ring.head + 1) % QCAP;
    ring.count--;
    pthread_cond_signal(&ring.not_full);
    pthread_mutex_unlock(&ring.mu);
}

int main(int argc, char **argv) { return q_run(argc, argv); }
