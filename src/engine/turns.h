/* engine/turns.h — turns on one device shared by the chat engine and the transcriber: each
 * bounded slice of work (an engine forward step; a Whisper encoder pass or decoder step) takes
 * a ticket and runs when its number comes up, one slice at a time, in the order they asked. */
#ifndef INFERD_ENGINE_TURNS_H
#define INFERD_ENGINE_TURNS_H

#include <stdint.h>

#include "base/err.h"

/* A ticket lock: when both sides want the device without pause they alternate slice by slice
 * (each asks again after the other already holds the next ticket), so a long transcription
 * delays each chat step by at most one Whisper slice and a long generation delays each Whisper
 * slice by at most one engine step; neither waits for the other to finish. */
struct device_turns;

int device_turns_create(struct device_turns **out, struct err *err);
void device_turns_free(struct device_turns *t);
/* Who takes a turn (counted apart). */
enum device_side { DEVICE_TURNS_ENGINE = 0, DEVICE_TURNS_TRANSCRIBER = 1 };

/* Waits for the caller's turn; NULL: no sharing, returns at once. */
void device_turns_take(struct device_turns *t, enum device_side side);
/* Ends the caller's slice; the next ticket's holder runs. NULL: nothing. */
void device_turns_give(struct device_turns *t);
/* Slices side has run so far. */
uint64_t device_turns_count(struct device_turns *t, enum device_side side);

#endif
