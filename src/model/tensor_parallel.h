/* model/tensor_parallel.h — tensor parallelism inside model/: which slice of each tensor a rank loads (shard.c) and the rank group that runs them in lock-step (tensor_parallel.c); internal to model/.
 *
 * Megatron's split of a Llama-family layer over N ranks:
 *   q_proj, k_proj, v_proj (and their biases): column-parallel, each rank
 *     the rows of its n_heads / N query heads and of their KV heads; when
 *     n_kv_heads < N every rank holds the one KV head its queries read
 *     (replicated, N / n_kv_heads ranks per KV head);
 *   o_proj: row-parallel, each rank the columns of its query heads; the
 *     partial outputs are summed (collective) before the residual add, and
 *     o_proj's bias is rank 0's alone so it is added once;
 *   gate_proj, up_proj: column-parallel over intermediate_size / N rows;
 *   down_proj: row-parallel, summed as o_proj;
 *   lm_head: vocabulary-parallel, rank r the rows [r * ceil(V / N), ...),
 *     each rank writing its columns of the host logits rows (a tied head is
 *     a view of the embedding's rows);
 *   embedding, norms, q/k norms: replicated.
 * A rank's model is an ordinary model whose config counts its share
 * (n_heads / N, its KV heads, intermediate_size / N), so the family's layer
 * runs unchanged on it; hidden_size and vocab_size stay whole. */
#ifndef INFERD_MODEL_TENSOR_PARALLEL_H
#define INFERD_MODEL_TENSOR_PARALLEL_H

#include "model/arch.h"

enum shard_axis {
    SHARD_WHOLE = 0, /* every rank loads all of it */
    SHARD_ROWS,      /* rows [lo, lo + n) */
    SHARD_COLS,      /* columns [lo, lo + n) of every row */
};

struct shard_part {
    enum shard_axis axis;
    int64_t lo, n;
};

/* The slice of tensor name (of the whole model's shape) that m's rank
 * loads; m->config is still the whole model's while it loads. */
void model_shard_part(const struct model *m, const char *name, struct shard_part *out);
/* Before any weight is loaded: the family and config can be split over
 * m->tp_ranks (-INFERD_EUNSUPPORTED for a family or feature that cannot,
 * -INFERD_EINVAL naming the count that N does not divide). */
int model_shard_check(const struct model *m, struct err *err);
/* After the weights: m->config becomes the rank's share, o_proj's bias
 * rank 0's alone, and a tied LM head a view of the rank's vocabulary rows
 * (a copy where a view cannot start there: model_matrix_rows_owned). */
int model_shard_finish(struct model *m, struct err *err);

/* One step of one rank (forward.c's driver, without the group). */
int model_forward_rank(const struct model *m, struct forward_state *st, struct kv_cache *kv,
                       const struct batch *batch, const struct forward_output *out,
                       struct err *err);

/* The group behind a front model (m->tp): rank r's state for each rank, a
 * step run on every rank at once, and the group's end. */
int tp_states_create(const struct model *front, struct forward_state *st, int max_tokens,
                     struct err *err);
int tp_forward(const struct model *front, struct forward_state *st, struct kv_cache *kv,
               const struct batch *batch, const struct forward_output *out, struct err *err);
void tp_group_free(struct tp_group *g);

#endif
