/* engine/turns.c — the device's ticket lock: one slice of work at a time, first asked, first run. */
#include "engine/turns.h"

#include <pthread.h>
#include <stdlib.h>

struct device_turns {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t next;        /* the ticket the next taker gets */
    uint64_t serving;     /* the ticket whose holder may run */
    uint64_t slices[2];   /* per side, under mu */
};

int device_turns_create(struct device_turns **out, struct err *err)
{
    struct device_turns *t = calloc(1, sizeof *t);
    if (!t)
        return err_set(err, INFERD_ENOMEM, "out of memory for the device's turns");
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    *out = t;
    return 0;
}

void device_turns_free(struct device_turns *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

void device_turns_take(struct device_turns *t, enum device_side side)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    uint64_t mine = t->next++;
    while (t->serving != mine)
        pthread_cond_wait(&t->cv, &t->mu);
    t->slices[side & 1]++;
    pthread_mutex_unlock(&t->mu);
}

void device_turns_give(struct device_turns *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->serving++;
    /* every waiter checks its ticket; only the next one proceeds */
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

uint64_t device_turns_count(struct device_turns *t, enum device_side side)
{
    if (!t)
        return 0;
    pthread_mutex_lock(&t->mu);
    uint64_t n = t->slices[side & 1];
    pthread_mutex_unlock(&t->mu);
    return n;
}
