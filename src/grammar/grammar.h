/* grammar/grammar.h — structured output: JSON Schema, regex, GBNF and choice lists compiled to one
 * pushdown automaton over bytes, and the token-mask engine that walks a tokenizer's vocabulary
 * through it. Above text/ (token bytes), below engine/ (the sampler applies the masks).
 *
 * The automaton. Every compiler produces rules; each rule is a DFA whose edges are byte ranges
 * or calls of other rules (a recursive transition network, i.e. a pushdown automaton). A
 * matcher's position is a set of stack tops: pairs (DFA state, stack), the stack a hash-consed
 * list of return states shared between pairs. Reading byte b moves every pair along its edge
 * for b (pairs without one drop out), then closes the set: a state with calls pushes its
 * return state and adds the callee's start; a final state pops (the return state with the
 * stack below it), and a final state of the root rule with an empty stack makes the position
 * accepting. Left recursion is refused at compile time, so the closure is finite.
 *
 *   a byte string w is accepted from position P  ⇔  reading w from P leaves a non-empty set or
 *                                                    an accepting position
 *   token t is allowed at P                       ⇔  t is not special, its bytes are not empty,
 *                                                    and its bytes are accepted from P
 *   EOS is allowed at P                           ⇔  P is accepting
 *   finished(P)                                   ⇔  P is accepting and no byte is accepted
 *   forced bytes at P                             =  the longest w (≤ cap) such that every
 *                                                    accepted continuation from P starts with w
 *                                                    and P is not accepting before its end
 *
 * Masks. A token's fate from a pair (s, stack) depends on the stack only if its bytes reach the
 * end of s's rule before they end. Per DFA state the engine keeps, computed on first use, the
 * tokens accepted whatever the stack (a bitset) and the few that reach the rule's end with
 * bytes left ("uncertain", walked with the real stack at run time); every other token is
 * rejected (computed on first use, or for every state at once by grammar_matcher_prepare). The
 * vocabulary is sorted by bytes (a trie in preorder), so walks share prefixes and prune whole
 * subtrees. The first matcher over a grammar binds that cache to its
 * vocabulary; it is shared by every later matcher with the same vocabulary (thread-safe).
 *
 * Bounded schemas end: a string with maxLength, an array with maxItems and a number with both
 * bounds each have a finite language (compact whitespace by default), so a schema bounded
 * everywhere admits finitely many answers. */
#ifndef INFERD_GRAMMAR_GRAMMAR_H
#define INFERD_GRAMMAR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

struct tokenizer;

/* ---- compiling ------------------------------------------------------------ */

/* compiled, immutable, shared by many matchers (thread-safe to share) */
struct grammar;

struct grammar_options {
    bool free_whitespace; /* JSON: any whitespace where JSON allows it; default compact */
    size_t max_states;    /* compile limit on DFA states (0: GRAMMAR_DEFAULT_MAX_STATES);
                           * over it -INFERD_ERANGE */
};
#define GRAMMAR_DEFAULT_MAX_STATES 65536

/* o may be NULL (defaults) in every compiler. Errors: -INFERD_EFORMAT malformed input (not JSON,
 * a regex or GBNF syntax error, with the byte offset); -INFERD_EUNSUPPORTED a construct the
 * engine cannot enforce, named with its JSON path ("schema.properties.a.patternProperties: not
 * supported"); -INFERD_EINVAL a grammar that matches nothing or is left-recursive;
 * -INFERD_ERANGE over max_states (or the expression size the limit implies); -INFERD_ENOMEM. */

/* JSON Schema, the draft 2020-12 subset structured output needs: type (incl. lists), properties
 * (in the given order), required, additionalProperties (absent or false: no other keys, as
 * OpenAI's strict mode; true or a schema: further keys after the declared ones, never a
 * declared one), items, prefixItems, minItems/maxItems, enum, const, anyOf, oneOf (as anyOf),
 * allOf of objects (merged), $ref/$defs/definitions (incl. recursion), nullable, keywords
 * beside anyOf (merged into each branch), string minLength/maxLength/pattern/format (date,
 * time, date-time, uuid, email, ipv4), integer minimum/maximum/exclusive* (exact digit
 * automata), number bounds (exact for integral values; a fraction only where the whole
 * interval [I, I+1) fits, at most 15 fraction digits when bounded on both sides; no exponent
 * once bounded). Unknown keywords and annotations are ignored, as the specification says; the
 * validation keywords it cannot enforce are refused: patternProperties, if/then/else,
 * dependent*, unevaluated*, not, propertyNames, min/maxProperties, contains, multipleOf,
 * uniqueItems true, external $refs, other formats, pattern or format with min/maxLength. */
int grammar_compile_json_schema(const char *schema, size_t len, const struct grammar_options *o,
                                struct grammar **out, struct err *err);
/* Any JSON object. */
int grammar_compile_json_object(const struct grammar_options *o, struct grammar **out,
                                struct err *err);
/* A regular expression (ECMAScript/PCRE subset: literals, ., classes incl. \d\w\s and their
 * negations, groups, (?:), |, * + ? {m} {m,} {m,n}; anchors only at the ends) matching the
 * whole output. Backreferences and lookaround are refused. */
int grammar_compile_regex(const char *re, size_t len, const struct grammar_options *o,
                          struct grammar **out, struct err *err);
/* GBNF (llama.cpp's syntax: name ::= alternatives, |, *, +, ?, {m,n}, "literal", [classes],
 * ., ( ), # comments); the start rule is root. */
int grammar_compile_ebnf(const char *text, size_t len, const struct grammar_options *o,
                         struct grammar **out, struct err *err);
/* Exactly one of n strings (n ≥ 1). */
int grammar_compile_choice(const char *const *choices, const size_t *lens, int n,
                           const struct grammar_options *o, struct grammar **out,
                           struct err *err);
void grammar_free(struct grammar *g);
/* A hash of the compiled automaton, for caches keyed by content. */
uint64_t grammar_digest(const struct grammar *g);
/* DFA states of the compiled automaton (what max_states limits). */
int grammar_n_states(const struct grammar *g);

/* ---- vocabularies ---------------------------------------------------------- */

/* per tokenizer, built once: every token's bytes (byte-level BPE decoded to raw bytes,
 * SentencePiece's ▁ to a space and <0xNN> to the byte; special tokens never allowed), sorted
 * into a trie */
struct grammar_vocab;
int grammar_vocab_create(const struct tokenizer *tok, struct grammar_vocab **out,
                         struct err *err);
/* From raw byte strings (tests, fuzzing); special may be NULL (none special). */
int grammar_vocab_from_bytes(const char *const *tokens, const size_t *lens, int n_vocab,
                             const bool *special, struct grammar_vocab **out, struct err *err);
void grammar_vocab_free(struct grammar_vocab *v);
int grammar_vocab_size(const struct grammar_vocab *v);
/* Token id's bytes (borrowed from v); NULL for an id out of range. */
const char *grammar_vocab_token(const struct grammar_vocab *v, int32_t id, size_t *len);

/* ---- matching -------------------------------------------------------------- */

/* one generation's position in the grammar; not thread-safe (one per sequence) */
struct grammar_matcher;
/* g and v must outlive the matcher. */
int grammar_matcher_create(const struct grammar *g, const struct grammar_vocab *v,
                           struct grammar_matcher **out, struct err *err);
void grammar_matcher_free(struct grammar_matcher *m);
/* Computes the mask cache for every state of the grammar now (shared by every matcher of this
 * grammar and vocabulary), so no later mask pays for a first visit; -INFERD_ENOMEM. */
int grammar_matcher_prepare(struct grammar_matcher *m);
/* Bits of the tokens allowed next (n_vocab bits, bit t of word t/32: bits[t >> 5] >> (t & 31));
 * eos_allowed when the grammar accepts here. -INFERD_ENOMEM only. */
int grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *bits, bool *eos_allowed);
/* -INFERD_EINVAL when not allowed (state unchanged); -INFERD_ERANGE when the position would
 * hold more than 4096 stack tops (a wildly ambiguous grammar; state unchanged). */
int grammar_matcher_accept_token(struct grammar_matcher *m, int32_t token);
/* Advances by raw bytes (one rollback step); -INFERD_EINVAL when not accepted (state unchanged). */
int grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *bytes, size_t len);
bool grammar_matcher_is_accepting(const struct grammar_matcher *m);
/* accepting and nothing more can follow */
bool grammar_matcher_is_finished(const struct grammar_matcher *m);
/* The bytes every continuation must start with from here (jump-forward), up to cap; returns
 * their length (0 when the next byte is not forced or the grammar may end here). */
size_t grammar_matcher_forced_bytes(const struct grammar_matcher *m, char *buf, size_t cap);
/* Undoes the last n accepted tokens (or accept_bytes calls); -INFERD_EINVAL when fewer were
 * accepted (state unchanged). */
int grammar_matcher_rollback(struct grammar_matcher *m, int n_tokens);
/* Back to the start state (history dropped). */
void grammar_matcher_reset(struct grammar_matcher *m);

#endif
